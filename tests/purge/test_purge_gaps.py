"""What a purge or a removal selects is gone, and what it could not decide is said.

- a Redis entry is its frame key: one whose metadata key is gone (``allkeys-lru``
  evicts that never-read key first; on a cluster its shard was down during the
  put) is listed, counted and purged; a metadata key alone is no entry;
- a disk purge log that could not be read once (EMFILE here; ESTALE or EIO on
  NFS) is read again at the next check: its purge is applied;
- ``ECCache.remove`` right after ``put`` is not undone by the entry's own
  writes still queued to the disk and remote tiers, also when they outlast
  ``close_timeout`` (removed again once they land);
- a purge by age or weights whose header reads the store failed (twice each)
  deletes nothing it cannot decide, says how many in one warning and exits 1.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis
import torch

from lmcache_ec import ECCache
from lmcache_ec.remote_names import redis_meta_key
from tests.cli.conftest import invoke, invoke_json, populate, runner, write_config

__all__ = ["invoke", "invoke_json", "runner"]  # CLI fixtures, used by name

MODEL = "org/purged"


def _remote_config(tmp_path, url: str, name: str = "remote.yaml") -> str:
    return write_config(
        tmp_path / name,
        local_cpu=True,
        max_local_cpu_size=0.0625,
        remote_url=url,
        remote_timeout=2.0,
    )


def _frames(client: redis.Redis) -> list[str]:
    return sorted(k.decode()[: -len("kv_bytes")] for k in client.scan_iter(match="ec1.*kv_bytes"))


def _wait_for(condition, what: str, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def test_a_redis_frame_whose_metadata_key_is_gone_is_listed_and_purged(
    tmp_path, redis_url, invoke, invoke_json
):
    config = _remote_config(tmp_path, redis_url)
    populate(config, MODEL, "tenant-1", 3)
    client = redis.Redis.from_url(redis_url)
    names = _frames(client)
    client.delete(redis_meta_key(names[0]))  # as allkeys-lru evicts it: it is never read
    metadata_alone = names[0].rsplit(".", 1)[0] + "." + "2" * 64
    client.set(redis_meta_key(metadata_alone), b"x")  # no frame: no entry

    rows = invoke_json("ls", "--config", config, "--tier", "remote")
    assert sorted(r["name"] for r in rows) == names
    assert not any(r["error"] for r in rows)
    assert invoke_json("stats", "--config", config)["tiers"]["remote"]["entries"] == 3

    out = invoke("purge", "--config", config, "--all", "--tier", "remote").stdout
    assert "remote: deleted 3 entries" in out
    assert _frames(client) == []
    with ECCache.from_config(config, model=MODEL, namespace="tenant-1") as fresh:
        assert fresh.get(f"{MODEL}|tenant-1|image-0") is None


# Run in a process of its own: it lowers the open-file limit for a moment.
_UNREADABLE_ONCE = """
import os, resource, sys
from lmcache_ec.key import slug
from lmcache_ec.purge.inventory import Selector
from lmcache_ec.purge.marker import MarkerWatch, PurgeMarker, append_disk

disk = sys.argv[1]
applied = []
watch = MarkerWatch(disk, "default", 1.0, lambda marker, tier: applied.append(tier))
assert not watch.poll_disk(now=10.0)  # no log yet
append_disk(disk, slug("default"), PurgeMarker.new(Selector(model="org/m")).to_line())
lowest = os.open(os.devnull, os.O_RDONLY)
os.close(lowest)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))  # no fd to spare: EMFILE
try:
    failed = watch.poll_disk(now=11.0)
finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
print(failed, watch.poll_disk(now=12.0), applied)
"""


def test_a_disk_purge_log_that_could_not_be_read_once_is_read_at_the_next_check(disk_dir):
    done = subprocess.run(
        [sys.executable, "-c", _UNREADABLE_ONCE, str(disk_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Too many open files" in done.stderr  # the failed read, logged
    assert done.stdout.split("\n")[-2] == "False True ['disk']"


@pytest.mark.parametrize("close_timeout", [30.0, 0.0], ids=["writes-land-first", "outwaited"])
def test_a_removal_right_after_put_is_not_undone_by_the_entrys_queued_writes(
    close_timeout, disk_dir, redis_url, make_cache
):
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 0.2,
        "remote_url": redis_url,
        "remote_timeout": 2.0,
        "close_timeout": close_timeout,
    }
    cache = make_cache(config, model=MODEL)
    hashes = [f"img{i}" for i in range(10)]
    tensor = torch.ones(256, 1024, dtype=torch.bfloat16)  # 512 KiB: writes take a while
    for mm_hash in hashes:
        assert cache.put(mm_hash, tensor)
        assert cache.remove(mm_hash)
    assert cache.flush(30)
    _wait_for(lambda: [cache.contains(h) for h in hashes] == [None] * 10, "every entry gone")
    assert list(disk_dir.glob("*.pt")) == []
    assert _frames(redis.Redis.from_url(redis_url)) == []


@pytest.mark.parametrize(
    "selection", [("--older-than", "0s"), ("--weights", "")], ids=["older-than", "weights"]
)
def test_a_purge_whose_header_reads_the_store_failed_says_so_and_exits_1(
    selection, tmp_path, redis_process, invoke
):
    """A user who may do all but EXISTS: the entries are listed, their headers
    cannot be read (a store failure, unlike a damaged header)."""
    config = _remote_config(tmp_path, redis_process.url)
    populate(config, MODEL, "tenant-1", 3)
    client = redis_process.client()
    client.acl_setuser(
        "lister", enabled=True, passwords=["+pw"], keys="*", commands=["+@all", "-exists"]
    )
    url = f"redis://lister:pw@127.0.0.1:{redis_process.port}"
    failing = _remote_config(tmp_path, url, "failing.yaml")

    result = invoke("purge", "--config", failing, *selection, "--tier", "remote", expect=1)
    said = " ".join(result.output.split())
    assert "Traceback" not in said
    assert said.count("purge incomplete") == 1  # one warning, not one per entry
    assert "the headers of 3 entries could not be read (remote: 3;" in said
    assert "remote: deleted 0 entries (0 B); 3 not decided (header unread)" in said
    assert len(_frames(client)) == 3
    rejected = client.info("commandstats")["cmdstat_exists"]["rejected_calls"]
    assert rejected == 6  # each read tried again once

    out = invoke("purge", "--config", config, *selection, "--tier", "remote").stdout
    assert "remote: deleted 3 entries" in out and "not decided" not in out
    assert _frames(client) == []
