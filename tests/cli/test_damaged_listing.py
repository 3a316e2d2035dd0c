"""ls / purge / stats when a Redis tier holds damage or cannot be listed.

- a Redis key of another type where an entry's frame should be is one damaged
  entry: listed as unreadable, counted, and purged with its namespace; the
  entries beside it are listed and purged as ever (never a skipped tier);
- a purge whose remote listing failed deletes nothing there, records no purge
  there and announces none: a warning, exit 1;
- ``ls`` whose header reads the store refuses lists those entries as
  unreadable, and says so: a warning, exit 1.
"""

from __future__ import annotations

import redis

from lmcache_ec.remote_names import redis_data_key, redis_meta_key

from .conftest import config_without, populate, remote_config_file


def _entry_keys(client: redis.Redis) -> list[bytes]:
    return sorted(client.scan_iter(match="ec1.*"))


def _with_a_wrong_type_entry(config: str, url: str, invoke_json) -> str:
    """Three good entries of tenant-1 on Redis and, beside them, one whose data
    key is a list (another type); returns the damaged entry's name."""
    populate(config, "org/model-a", "tenant-1", 3)
    good = invoke_json("ls", "--config", config, "--tier", "remote")[0]["name"]
    damaged = good.rsplit(".", 1)[0] + "." + "1" * 64
    client = redis.Redis.from_url(url)
    client.rpush(redis_data_key(damaged), b"not a frame")
    client.set(redis_meta_key(damaged), b"x")
    return damaged


def test_a_redis_key_of_another_type_is_listed_as_one_unreadable_entry(
    tmp_path, disk_dir, redis_url, invoke, invoke_json
):
    config = remote_config_file(tmp_path, disk_dir, redis_url)
    damaged = _with_a_wrong_type_entry(config, redis_url, invoke_json)

    rows = invoke_json("ls", "--config", config, "--tier", "remote")
    assert len(rows) == 4
    assert [r["name"] for r in rows if r["error"]] == [damaged]
    assert {r["mm_hash"] for r in rows if not r["error"]} == {
        f"org/model-a|tenant-1|image-{i}" for i in range(3)
    }
    assert "4 entries" in invoke("ls", "--config", config, "--tier", "remote").stdout
    assert invoke_json("stats", "--config", config)["tiers"]["remote"]["entries"] == 4


def test_ls_whose_header_reads_the_store_refuses_exits_1(
    tmp_path, disk_dir, redis_process, invoke, invoke_json
):
    """A user who may list but not read values: every entry is listed as
    unreadable, and ``ls`` says so and exits 1 (a script must not take it for
    a listing of what the store holds)."""
    config = remote_config_file(tmp_path, disk_dir, redis_process.url)
    populate(config, "org/model-a", "tenant-1", 3)
    no_reads = config_without(tmp_path, disk_dir, redis_process, "getrange")

    rows = invoke_json("ls", "--config", no_reads, "--tier", "remote", expect=1)
    assert len(rows) == 3 and all("header read failed" in row["error"] for row in rows)
    said = " ".join(invoke("ls", "--config", no_reads, "--tier", "remote", expect=1).output.split())
    assert "3 remote headers could not be read" in said


def test_a_purge_removes_a_wrong_type_entry_and_the_good_ones_beside_it(
    tmp_path, disk_dir, redis_url, invoke, invoke_json
):
    config = remote_config_file(tmp_path, disk_dir, redis_url)
    _with_a_wrong_type_entry(config, redis_url, invoke_json)

    out = invoke("purge", "--config", config, "--namespace", "tenant-1", "--tier", "remote").stdout
    assert "remote: deleted 4 entries" in out
    assert _entry_keys(redis.Redis.from_url(redis_url)) == []


def test_a_purge_whose_remote_listing_failed_records_and_announces_nothing_there(
    tmp_path, disk_dir, redis_process, invoke
):
    """A user who may do all but SCAN: the listing fails, the purge log could be written."""
    config = remote_config_file(tmp_path, disk_dir, redis_process.url)
    populate(config, "org/model-a", "tenant-1", 3)
    client = redis_process.client()
    no_scan = config_without(tmp_path, disk_dir, redis_process, "scan")
    stored = _entry_keys(client)

    result = invoke(
        "purge", "--config", no_scan, "--namespace", "tenant-1", "--tier", "remote", expect=1
    )
    said = " ".join(result.output.split())
    assert "Traceback" not in said
    assert "remote tier skipped: listing the remote tier failed" in said and "'scan'" in said
    assert "remote: deleted" not in said and "Purge recorded" not in said
    assert _entry_keys(client) == stored and len(stored) == 6  # 3 entries, 2 keys each
    assert list(client.scan_iter(match="ec-purge*")) == []
