"""ls / purge / stats / doctor against a real redis-server (tests/servers.py)."""

from __future__ import annotations

import json

from .conftest import populate, remote_config_file


def test_ls_purge_stats_see_the_redis_tier(
    tmp_path, disk_dir, redis_url, invoke, invoke_json, make_cache
):
    config = remote_config_file(tmp_path, disk_dir, redis_url)
    hashes = populate(config, "org/model-a", "tenant-1", 3)
    populate(config, "org/model-b", "tenant-1", 2)

    rows = invoke_json("ls", "--config", config, "--tier", "remote")
    assert len(rows) == 5
    assert {r["mm_hash"] for r in rows if r["model"] == "org/model-a"} == set(hashes)
    assert all(r["shape"] == [4, 8] and r["dtype"] == "bfloat16" for r in rows)

    stats = invoke_json("stats", "--config", config)
    assert stats["tiers"]["remote"]["entries"] == 5
    assert stats["tiers"]["disk"]["entries"] == 5

    out = invoke("purge", "--config", config, "--model", "org/model-a", "--dry-run").stdout
    assert "remote: would delete 3 entries" in out and "disk: would delete 3 entries" in out
    assert len(invoke_json("ls", "--config", config, "--tier", "remote")) == 5

    out = invoke("purge", "--config", config, "--model", "org/model-a").stdout
    assert "remote: deleted 3 entries" in out and "disk: deleted 3 entries" in out
    left = invoke_json("ls", "--config", config)
    assert {r["model"] for r in left} == {"org/model-b"} and len(left) == 4
    # A fresh engine (empty CPU tier) finds the purged entries nowhere.
    cache = make_cache(config, model="org/model-a", namespace="tenant-1")
    assert [cache.contains(h) for h in hashes] == [None, None, None]


def test_doctor_checks_redis(tmp_path, disk_dir, redis_url, invoke):
    config = remote_config_file(tmp_path, disk_dir, redis_url)
    out = invoke("doctor", "--config", config).stdout
    assert "reachable" in out and "All checks passed" in out


def test_doctor_reports_unreachable_redis(tmp_path, disk_dir, invoke):
    from tests.servers import free_port

    config = remote_config_file(tmp_path, disk_dir, f"redis://127.0.0.1:{free_port()}")
    result = invoke("doctor", "--config", config, expect=1)
    assert "remote tier" in result.stdout and "fail" in result.stdout
    assert "problem" in result.stdout


def test_doctor_redacts_the_password(tmp_path, disk_dir, invoke):
    from tests.servers import free_port

    url = f"redis://user:hunter2secret@127.0.0.1:{free_port()}"
    result = invoke("doctor", "--config", remote_config_file(tmp_path, disk_dir, url), expect=1)
    assert "hunter2secret" not in result.output


def test_stats_shows_the_remote_url_without_its_password(
    tmp_path, disk_dir, redis_server_auth, invoke
):
    from tests.servers import REDIS_PASSWORD, free_port

    # Reachable (the remote row is shown), and unreachable (its listing fails: a warning).
    url = f"{redis_server_auth.url}/0"
    config = remote_config_file(tmp_path, disk_dir, url)
    (tmp_path / "dead").mkdir()
    dead = remote_config_file(
        tmp_path / "dead", disk_dir, f"redis://:{REDIS_PASSWORD}@127.0.0.1:{free_port()}/0"
    )
    results = [
        invoke("stats", "--config", config),
        invoke("stats", "--config", config, "--json"),
        invoke("stats", "--config", dead, expect=1),
    ]
    for result in results:
        assert REDIS_PASSWORD not in result.stdout and REDIS_PASSWORD not in result.stderr
    location = f"redis://:***@127.0.0.1:{redis_server_auth.port}/0"
    assert location in results[0].stdout
    assert json.loads(results[1].stdout)["tiers"]["remote"]["location"] == location
