"""demo and bench local, on tiny sizes (their output, not their timings)."""

from __future__ import annotations

import json
import os

from lmcache_ec.bench.demo_workload import DEMO_MODEL, DEMO_NAMESPACE


def test_demo_small_run(tmp_path, config_file, disk_dir, invoke, invoke_json):
    out = invoke("demo", "--config", config_file, "--images", "3", "--requests", "12").stdout
    assert "bit-identical" in out and "time saved" in out and "cpu hits" in out
    files = [n for n in os.listdir(disk_dir) if n.endswith(".pt")]
    assert 1 <= len(files) <= 3

    report = invoke_json(
        "demo", "--config", config_file, "--images", "3", "--requests", "12", "--seed", "1"
    )
    assert report["mismatched"] == 0 and report["verified"] >= 1
    before, after = report["phases"]
    assert before["requests"] + after["requests"] == 12
    for phase in (before, after):
        assert sum(phase["hits"].values()) + phase["misses"] == phase["requests"]
    # Every distinct image is encoded once; after the restart none is re-encoded
    # (what the first phase stored comes back from disk).
    assert report["encode_count"] == before["misses"] + after["misses"] <= 3
    assert after["hits"].get("disk", 0) >= 1 or after["misses"] == after["requests"]

    rows = invoke_json(
        "ls", "--config", config_file, "--model", DEMO_MODEL, "--namespace", DEMO_NAMESPACE
    )
    assert rows and all(r["shape"] == [256, 512] and r["dtype"] == "bfloat16" for r in rows)


def test_bench_local_json(tmp_path, invoke):
    path = tmp_path / "bench.json"
    invoke(
        "bench",
        "local",
        "--shapes",
        "8x16",
        "--dtypes",
        "bfloat16,float32",
        "--iterations",
        "3",
        "--cpu-gb",
        "0.02",
        "--startup-cpu-gb",
        "0.02",
        "--directory",
        str(tmp_path),
        "--json",
        str(path),
    )
    result = json.loads(path.read_text())
    rows = result["rows"]
    engines = {r["engine"] for r in rows}
    assert engines == {"lmcache-ec", "ECCacheEngine", "ECCacheEngine (StorageManager.get)", "floor"}
    for row in rows:
        assert row["n"] == 3 and row["median_ms"] >= 0 and row["p99_ms"] >= row["median_ms"]
    ours = {(r["tier"], r["op"], r["dtype"]): r for r in rows if r["engine"] == "lmcache-ec"}
    assert all(
        ours[(t, "get", d)]["hits"] == 3 for t in ("cpu", "disk") for d in ("bfloat16", "float32")
    )
    assert ours[("disk", "get after restart", "float32")]["hits"] == 3
    upstream = {(r["tier"], r["op"]): r for r in rows if r["engine"] == "ECCacheEngine"}
    assert upstream[("cpu", "get")]["hits"] == 3
    assert upstream[("disk", "get")]["hits"] == 0  # its get() reads only the CPU tier
    assert {(r["tier"], r["op"]) for r in result["ratios"]} >= {("cpu", "get"), ("disk", "get")}
    for engine in ("lmcache-ec", "ECCacheEngine"):
        assert result["startup"][engine]["seconds"] > 0, result["startup"]


def test_bench_rejects_bad_shape(invoke):
    assert "invalid shape" in invoke("bench", "local", "--shapes", "8by16", expect=2).output


def test_bench_remote_against_real_redis(tmp_path, redis_url, invoke):
    path = tmp_path / "remote.json"
    out = invoke(
        "bench", "remote", "--redis-url", redis_url, "--iterations", "3", "--json", str(path)
    ).stdout
    assert "redis-py GET" in out
    rows = json.loads(path.read_text())
    ours = {r["op"]: r for r in rows if r["engine"] == "lmcache-ec"}
    assert set(ours) == {"get", "put (stored)", "put (returns)"}
    assert ours["get"]["hits"] == {"remote": 3}  # every get really came from Redis
    assert ours["get"]["ratio"] > 0


def test_bench_remote_needs_a_target(invoke):
    result = invoke("bench", "remote", expect=2)
    assert "--redis-url" in result.output


def test_bench_connector_json(tmp_path, invoke):
    path = tmp_path / "connector.json"
    invoke("bench", "connector", "tests/vllm/data/tiny-blip2", "--json", str(path))
    result = json.loads(path.read_text())
    assert result["has_cache_item_us"]["ready"] > 0
    assert result["save_caches_ms"]["return"] > 0
