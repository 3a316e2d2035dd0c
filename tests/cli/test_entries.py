"""ls / purge / stats against a real disk tier."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import torch

from lmcache_ec.purge.marker import log_name

from .conftest import populate, write_config


def _files(disk_dir) -> set[str]:
    return {n for n in os.listdir(disk_dir) if n.endswith(".pt")}


def test_ls_lists_header_fields_and_filters(config_file, disk_dir, invoke, invoke_json):
    populate(config_file, "org/model-a", "tenant-1", 3, rows=5)
    populate(config_file, "org/model-b", "tenant-2", 2)
    rows = invoke_json("ls", "--config", config_file)
    assert len(rows) == 5
    a_rows = [r for r in rows if r["model"] == "org/model-a"]
    assert len(a_rows) == 3
    assert {r["namespace"] for r in a_rows} == {"tenant-1"}
    assert {r["mm_hash"] for r in a_rows} == {f"org/model-a|tenant-1|image-{i}" for i in range(3)}
    assert all(
        r["shape"] == [5, 8] and r["dtype"] == "bfloat16" and r["tier"] == "disk" for r in a_rows
    )
    assert all(r["size"] == os.path.getsize(disk_dir / f"{r['name']}.pt") for r in rows)
    assert all(0 <= r["age_seconds"] < 600 for r in rows)

    only_b = invoke_json("ls", "--config", config_file, "--model", "org/model-b")
    assert {r["model"] for r in only_b} == {"org/model-b"} and len(only_b) == 2
    only_ns = invoke_json("ls", "--config", config_file, "--namespace", "tenant-1")
    assert len(only_ns) == 3
    assert invoke_json("ls", "--config", config_file, "--namespace", "nobody") == []

    table = invoke("ls", "--config", config_file).stdout
    assert "5 entries" in table and "tenant-1" in table and "bfloat16" in table


def test_ls_shows_corrupt_entry_as_unreadable(config_file, disk_dir, invoke_json):
    populate(config_file, "org/model-a", "default", 2)
    victim = sorted(_files(disk_dir))[0]
    with open(disk_dir / victim, "r+b") as stream:
        stream.write(b"garbage!")
    rows = invoke_json("ls", "--config", config_file)
    bad = [r for r in rows if r["error"]]
    assert [r["name"] + ".pt" for r in bad] == [victim]
    assert bad[0]["error"] == "bad magic"


def test_purge_dry_run_deletes_nothing(config_file, disk_dir, invoke):
    populate(config_file, "org/model-a", "default", 3)
    before = _files(disk_dir)
    out = invoke("purge", "--config", config_file, "--all", "--dry-run").stdout
    assert "would delete 3 entries" in out
    assert _files(disk_dir) == before


def test_purge_by_model_and_namespace(config_file, disk_dir, invoke, invoke_json, make_cache):
    a = populate(config_file, "org/model-a", "tenant-1", 3)
    populate(config_file, "org/model-b", "tenant-1", 2)
    populate(config_file, "org/model-a", "tenant-2", 1)
    out = invoke(
        "purge", "--config", config_file, "--model", "org/model-a", "--namespace", "tenant-1"
    ).stdout
    assert "deleted 3 entries" in out
    left = invoke_json("ls", "--config", config_file)
    assert sorted((r["model"], r["namespace"]) for r in left) == [
        ("org/model-a", "tenant-2"),
        ("org/model-b", "tenant-1"),
        ("org/model-b", "tenant-1"),
    ]
    # The engine no longer finds the purged entries after a restart.
    with make_cache(config_file, model="org/model-a", namespace="tenant-1") as cache:
        assert all(cache.get(h) is None for h in a)
    invoke("purge", "--config", config_file, "--namespace", "tenant-1")
    assert [r["namespace"] for r in invoke_json("ls", "--config", config_file)] == ["tenant-2"]


def test_purge_running_engine_turns_entries_into_misses(config_file, disk_dir, invoke, make_cache):
    config = {
        "local_cpu": False,
        "max_local_cpu_size": 0.0625,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 1.0,
    }
    hashes = populate(config_file, "org/model-a", "default", 2)
    cache = make_cache(config, model="org/model-a")
    assert cache.get(hashes[0]) is not None
    invoke("purge", "--config", config_file, "--all")
    assert cache.get(hashes[0]) is None
    assert cache.get(hashes[1]) is None


def test_purge_older_than(config_file, disk_dir, invoke):
    populate(config_file, "org/model-a", "default", 2)
    out = invoke("purge", "--config", config_file, "--older-than", "1h").stdout
    assert "deleted 0 entries" in out and len(_files(disk_dir)) == 2
    time.sleep(1.1)
    out = invoke("purge", "--config", config_file, "--older-than", "1s").stdout
    assert "deleted 2 entries" in out and not _files(disk_dir)


def test_purge_needs_a_selector(config_file, invoke):
    result = invoke("purge", "--config", config_file, expect=2)
    assert "--all" in result.output
    assert (
        "invalid duration"
        in invoke("purge", "--config", config_file, "--older-than", "soon", expect=2).output
    )


def test_stats_counts_disk_entries(config_file, disk_dir, invoke, invoke_json):
    populate(config_file, "org/model-a", "default", 3)
    populate(config_file, "org/model-b", "default", 1)
    data = invoke_json("stats", "--config", config_file)
    total = sum(os.path.getsize(disk_dir / n) for n in _files(disk_dir))
    assert data["tiers"]["disk"]["entries"] == 4
    assert data["tiers"]["disk"]["bytes"] == total
    assert sorted(g["entries"] for g in data["groups"]) == [1, 3]
    assert data["counters"] is None
    assert "--metrics-url" in invoke("stats", "--config", config_file).stdout


def test_missing_config_file_is_a_usage_error(tmp_path, invoke):
    result = invoke("ls", "--config", str(tmp_path / "nope.yaml"), expect=2)
    assert "config file not found" in result.output


def test_model_served_from_a_tmp_path_is_listed_indexed_and_kept(
    config_file, disk_dir, invoke, invoke_json, make_cache
):
    """A model path like /tmp/models/x puts ``.tmp-`` into storage names."""
    model = "/tmp/models/x"
    tensor = torch.ones(4, 8, dtype=torch.bfloat16)
    with make_cache(config_file, model=model) as cache:
        assert cache.put("image", tensor)
        assert cache.flush(10)
    [name] = os.listdir(disk_dir)
    assert ".tmp-" in name  # the slug of the model path
    old = time.time() - 7200  # older than any temp file is allowed to live
    os.utime(disk_dir / name, (old, old))

    listed = invoke_json("ls", "--config", config_file, "--model", model)
    assert [row["mm_hash"] for row in listed] == ["image"]
    assert invoke_json("stats", "--config", config_file)["tiers"]["disk"]["entries"] == 1
    with make_cache(config_file, model=model) as restarted:  # indexed, not deleted
        assert restarted.contains("image") == "disk"
        assert torch.equal(restarted.get("image"), tensor)
    assert os.listdir(disk_dir) == [name]
    invoke("purge", "--config", config_file, "--model", model)
    assert not (disk_dir / name).exists()
    assert invoke_json("stats", "--config", config_file)["tiers"]["disk"]["entries"] == 0


def test_purge_and_ls_by_weights_version(config_file, disk_dir, invoke, invoke_json, make_cache):
    for weights in ("v1", "v2", None):
        with make_cache(config_file, model="org/model-a", weights=weights) as cache:
            assert cache.put("image", torch.ones(4, 8, dtype=torch.bfloat16))
    rows = invoke_json("ls", "--config", config_file, "--weights", "v1")
    assert [r["weights"] for r in rows] == ["v1"]
    out = invoke("purge", "--config", config_file, "--weights", "v1").stdout
    assert "deleted 1 entries" in out and "Purge recorded in the purge log on disk" in out
    left = invoke_json("ls", "--config", config_file)
    assert sorted(r["weights"] for r in left) == ["", "v2"]
    assert os.path.exists(disk_dir / log_name("default"))  # the namespace it reached
    assert len(_files(disk_dir)) == 2


def test_stats_reports_the_whole_shared_directory(config_file, disk_dir, invoke_json, make_cache):
    """Entries of every process on the directory, the limit, nothing in flight."""
    with (
        make_cache(config_file, model="org/model-a") as first,
        make_cache(config_file, model="org/model-b") as second,
    ):
        for i in range(3):
            assert first.put(f"a{i}", torch.ones(4, 8, dtype=torch.bfloat16))
            assert second.put(f"b{i}", torch.ones(4, 8, dtype=torch.bfloat16))
        assert first.flush(10) and second.flush(10)
        disk = invoke_json("stats", "--config", config_file)["tiers"]["disk"]
    assert disk["entries"] == 6
    assert disk["bytes"] == sum(os.path.getsize(disk_dir / n) for n in _files(disk_dir))
    assert disk["capacity"] == 1024**3
    assert disk["writing_bytes"] == 0


def test_node_tier_is_listed_and_purged(tmp_path, disk_dir, invoke, invoke_json, make_cache):
    node_dir = tempfile.mkdtemp(prefix="ec-node-cli-", dir="/dev/shm")
    try:
        config = write_config(
            tmp_path / "node.yaml",
            local_disk=str(disk_dir),
            node_tier=True,
            node_dir=node_dir,
            max_node_size=0.01,
        )
        tensor = torch.ones(4, 8, dtype=torch.bfloat16)
        with make_cache(config, model="org/model-a") as cache:
            assert cache.put("image", tensor)
            assert cache.flush(10)
            assert cache.contains("image") == "node"
            listed = invoke_json("ls", "--config", config, "--tier", "node")
            assert [(row["tier"], row["mm_hash"]) for row in listed] == [("node", "image")]
            stats = invoke_json("stats", "--config", config)["tiers"]
            assert stats["node"]["entries"] == 1 and stats["disk"]["entries"] == 1
            assert stats["node"]["capacity"] == int(0.01 * 1024**3)
            result = invoke("purge", "--config", config, "--model", "org/model-a")
            assert "node: deleted 1 entries" in result.stdout
            # The node tier is read by every process directly: gone at once.
            assert cache.contains("image") is None
        assert invoke_json("ls", "--config", config) == []
    finally:
        shutil.rmtree(node_dir, ignore_errors=True)
