"""``lmcache-ec purge`` reaches engines that keep running (purge markers).

A serving engine runs in a child process and holds entries in its CPU tier;
``lmcache-ec purge`` runs as a third process. The bounds asserted are the
documented ones (docs/operations.md, "Purge"), computed from the configured
``purge_check_s`` and ``remote_timeout``: the test waits that long, then
expects a miss; it never asserts how fast anything was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml

from lmcache_ec.config import load_config
from lmcache_ec.key import slug
from lmcache_ec.purge import inventory
from lmcache_ec.purge import marker as marker_module
from lmcache_ec.purge.inventory import Selector
from lmcache_ec.purge.marker import (
    CLOCK_SKEW_S,
    PurgeMarker,
    append_disk,
    append_remote,
    log_name,
    read_disk,
    records,
)
from lmcache_ec.remote.catalog import open_catalog

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).parent / "lmcache-ec")
INTERVAL = 0.5  # purge_check_s of the serving engine
REMOTE_TIMEOUT = 1.0
MODEL = "org/served"

SERVER = textwrap.dedent(
    """
    import json, sys, torch
    from lmcache_ec import ECCache
    config = json.loads(sys.argv[1])
    with ECCache.from_config(config, model=sys.argv[2], dtype=torch.bfloat16) as cache:
        for i in range(3):
            assert cache.put(f"image-{i}", torch.full((4, 8), float(i), dtype=torch.bfloat16))
        assert cache.flush(30)
        print("ready", flush=True)
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            if command == "get":
                before = dict(cache.stats.snapshot()["hits"])
                found = cache.get(arg) is not None
                after = cache.stats.snapshot()["hits"]
                tier = next((t for t in after if after[t] != before.get(t, 0)), None)
                print(json.dumps({"hit": found, "tier": tier}), flush=True)
            elif command == "contains":
                print(json.dumps({"tier": cache.contains(arg)}), flush=True)
            elif command == "stats":
                seen = cache.stats.snapshot()["purges_seen"]
                print(json.dumps({"purges_seen": seen}), flush=True)
            else:
                break
    """
)


class Server:
    """A running ECCache in a child process, asked over stdin/stdout."""

    def __init__(self, config: dict, model: str = MODEL) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, json.dumps(config), model],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR"},
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def get(self, mm_hash: str) -> str | None:
        """The tier that served ``mm_hash``, or None on a miss."""
        answer = self.ask(f"get {mm_hash}")
        return answer["tier"] if answer["hit"] else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def purge(config_path: str, *args: str) -> str:
    """Run ``lmcache-ec purge`` as its own process; returns its output."""
    result = subprocess.run(
        [CLI, "purge", "--config", config_path, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR", "COLUMNS": "200"},
        timeout=120,
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout


def write_config(path: Path, **ec) -> str:
    path.write_text(yaml.safe_dump({"ec": ec}))
    return str(path)


@pytest.fixture
def server_factory():
    servers: list[Server] = []

    def start(config: dict, model: str = MODEL) -> Server:
        servers.append(Server(config, model))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_purge_on_a_shared_disk_reaches_a_running_engine(tmp_path, disk_dir, server_factory):
    ec = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 0.5,
        "purge_check_s": INTERVAL,
    }
    server = server_factory(ec)
    config = write_config(tmp_path / "purger.yaml", **ec)
    assert server.get("image-0") == "cpu"

    # A purge of another model: its marker is noticed, nothing of ours is dropped.
    out = purge(config, "--model", "org/other")
    assert "Purge recorded in the purge log on disk" in out
    time.sleep(INTERVAL)  # the documented bound for a disk marker
    assert server.get("image-0") == "cpu"
    assert server.ask("stats")["purges_seen"] == 1

    out = purge(config, "--model", MODEL)
    assert "disk: deleted 3 entries" in out
    time.sleep(INTERVAL)
    # Any read starting purge_check_s after the purge misses: the CPU copy is gone.
    assert server.get("image-1") is None
    assert server.ask("contains image-2") == {"tier": None}
    assert server.get("image-2") is None
    assert server.ask("stats")["purges_seen"] == 2
    assert not [n for n in os.listdir(disk_dir) if n.endswith(".pt")]


def test_purge_through_redis_reaches_an_engine_with_its_own_disk(
    tmp_path, redis_url, server_factory
):
    served_disk = tmp_path / "served-disk"
    purger_disk = tmp_path / "purger-disk"
    served_disk.mkdir()
    purger_disk.mkdir()
    common = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "max_local_disk_size": 0.5,
        "remote_url": redis_url,
        "remote_timeout": REMOTE_TIMEOUT,
        "purge_check_s": INTERVAL,
    }
    server = server_factory({**common, "local_disk": str(served_disk)})
    config = write_config(tmp_path / "purger.yaml", **common, local_disk=str(purger_disk))
    assert server.get("image-0") == "cpu"
    assert len([n for n in os.listdir(served_disk) if n.endswith(".pt")]) == 3

    out = purge(config, "--model", MODEL)
    assert "remote: deleted 3 entries" in out and "remote" in out.split("purge log on")[1]
    # Remote marker: read by the engine's watch thread every purge_check_s, each
    # read bounded by remote_timeout; then the engine's own disk is purged too.
    time.sleep(INTERVAL + REMOTE_TIMEOUT)
    deadline = time.monotonic() + 5  # grace for the child to finish applying it
    while server.ask("stats")["purges_seen"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for i in range(3):
        assert server.get(f"image-{i}") is None
    assert not [n for n in os.listdir(served_disk) if n.endswith(".pt")]


def test_purge_through_redis_reaches_an_engine_node_tier(tmp_path, redis_url, server_factory):
    node_base = tempfile.mkdtemp(prefix="ec-node-purge-", dir="/dev/shm")
    purger_disk = tmp_path / "purger-disk"
    purger_disk.mkdir()
    common = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "remote_url": redis_url,
        "remote_timeout": REMOTE_TIMEOUT,
        "purge_check_s": INTERVAL,
    }
    try:
        server = server_factory({**common, "node_tier": True, "node_dir": node_base})
        config = write_config(tmp_path / "purger.yaml", **common, local_disk=str(purger_disk))
        assert server.get("image-0") == "node"
        assert len(_node_files(node_base)) == 3

        out = purge(config, "--model", MODEL)
        assert "remote: deleted 3 entries" in out
        deadline = time.monotonic() + INTERVAL + REMOTE_TIMEOUT + 5
        while server.ask("stats")["purges_seen"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for i in range(3):
            assert server.get(f"image-{i}") is None
        assert _node_files(node_base) == []
    finally:
        shutil.rmtree(node_base, ignore_errors=True)


def test_two_tenants_purging_at_once_through_redis(tmp_path, redis_url, server_factory):
    """Tenants a and b run ``lmcache-ec purge`` at the same moment: each running
    engine stops serving its own tenant's entries (that no other namespace's go
    is tests/purge/test_purge_log.py's, with engines in one process)."""
    common = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "max_local_disk_size": 0.5,
        "remote_url": redis_url,
        "remote_timeout": REMOTE_TIMEOUT,
        "purge_check_s": INTERVAL,
    }

    def start(tenant: str) -> Server:
        disk = tmp_path / f"disk-{tenant}"
        return server_factory({**common, "local_disk": str(disk), "namespace": tenant})

    with ThreadPoolExecutor(2) as pool:  # the engines start side by side
        servers = dict(zip("ab", pool.map(start, "ab"), strict=True))
    for server in servers.values():
        assert server.get("image-0") == "cpu"
    purger_disk = tmp_path / "purger-disk"
    config = write_config(tmp_path / "purger.yaml", **common, local_disk=str(purger_disk))
    purges = [
        subprocess.Popen(
            [CLI, "purge", "--config", config, "--namespace", tenant, "--tier", "remote"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR", "COLUMNS": "200"},
        )
        for tenant in "ab"
    ]
    for purge_process in purges:
        out, err = purge_process.communicate(timeout=120)
        assert purge_process.returncode == 0, (out, err)
        assert "remote: deleted 3 entries" in out
    deadline = time.monotonic() + INTERVAL + REMOTE_TIMEOUT + 10
    for tenant in "ab":
        while servers[tenant].ask("stats")["purges_seen"] < 1:
            assert time.monotonic() < deadline, f"tenant {tenant}'s engine never saw its purge"
            time.sleep(0.05)
        assert [servers[tenant].get(f"image-{i}") for i in range(3)] == [None] * 3
        assert not any(n.endswith(".pt") for n in os.listdir(tmp_path / f"disk-{tenant}"))


def _node_files(base: str) -> list[str]:
    from lmcache_ec.tiers.disk_layout import entry_stem
    from lmcache_ec.tiers.node import node_dirs

    return [n for d in node_dirs(base) for n in os.listdir(d) if entry_stem(n) is not None]


def _served_disk_config(tmp_path, redis_url) -> tuple[Path, dict]:
    served_disk = tmp_path / "served-disk"
    served_disk.mkdir()
    return served_disk, {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": str(served_disk),
        "max_local_disk_size": 0.5,
        "remote_url": redis_url,
        "remote_timeout": REMOTE_TIMEOUT,
        "purge_check_s": INTERVAL,
    }


def _apply_record(cache, config: dict, marker: PurgeMarker) -> None:
    """``marker`` in the remote purge log only (the store keeps the entries),
    once the engine has applied it."""
    with open_catalog(load_config(config)) as catalog:
        append_remote(catalog, slug("default"), marker.to_line())
    deadline = time.monotonic() + INTERVAL + REMOTE_TIMEOUT + 5
    while cache.stats.snapshot()["purges_seen"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _disk_entries(served_disk: Path) -> set[str]:
    return {n.removesuffix(".pt") for n in os.listdir(served_disk) if n.endswith(".pt")}


def test_entries_written_after_a_purge_are_kept(tmp_path, redis_url, make_cache, monkeypatch):
    """A purge an engine applies late selects only entries created before it
    (give or take the clock skew allowed, shortened here)."""
    monkeypatch.setattr(marker_module, "CLOCK_SKEW_S", 0.1)
    served_disk, config = _served_disk_config(tmp_path, redis_url)
    cache = make_cache(config, model=MODEL)
    assert cache.put("old", torch.ones(4, 8, dtype=torch.bfloat16))
    time.sleep(0.05)
    purged_at = time.time()
    time.sleep(0.2)
    assert cache.put("new", torch.ones(4, 8, dtype=torch.bfloat16))
    assert cache.flush(30)
    _apply_record(cache, config, PurgeMarker("f" * 32, purged_at, model=MODEL))
    assert _disk_entries(served_disk) == {cache.key("new").storage_name}
    assert inventory.scan_cpu(cache) == []  # the CPU tier keeps no creation time


def test_entries_of_a_writer_whose_clock_runs_ahead_are_purged(tmp_path, redis_url, make_cache):
    """The purging host's clock is behind this engine's: what the engine wrote
    just before the purge carries a later "created" than the purge's time,
    and is purged all the same (it was kept, and served)."""
    served_disk, config = _served_disk_config(tmp_path, redis_url)
    cache = make_cache(config, model=MODEL)
    time.sleep(1.0)  # the purge is news to the engine: after its start, either clock
    assert cache.put("before", torch.ones(4, 8, dtype=torch.bfloat16))
    assert cache.flush(30)
    _apply_record(cache, config, PurgeMarker("e" * 32, time.time() - 0.5, model=MODEL))
    assert _disk_entries(served_disk) == set()
    assert inventory.scan_cpu(cache) == []


def test_marker_is_never_an_entry(tmp_path, disk_dir, make_cache):
    append_disk(str(disk_dir), slug("default"), PurgeMarker.new(Selector(model="m")).to_line())
    log = log_name("default")
    with make_cache() as cache:
        assert cache.put("x", torch.ones(2, 8))
        assert cache.flush(30)
        assert [key for key, *_ in cache._disk.entries()] == [cache.key("x")]
        assert cache.stats.snapshot()["purges_seen"] == 0  # written before it started
    with make_cache():
        pass  # a restart indexes and sweeps the directory
    assert [e.name for e in inventory.scan_disk(str(disk_dir))] == [cache.key("x").storage_name]
    assert len(records(read_disk(str(disk_dir), "default"))) == 1
    assert sorted(os.listdir(disk_dir)) == sorted([log, cache.key("x").storage_name + ".pt"])


def test_marker_round_trip():
    marker = PurgeMarker.new(Selector(namespace="ns", weights="v2", older_than=60))
    again = PurgeMarker.parse(marker.to_line().strip(), "ns", now=marker.time + 1)
    assert again == marker
    selector = again.selector("ns")
    assert (selector.namespace, selector.model, selector.weights) == ("ns", None, "v2")
    assert selector.created_before == pytest.approx(marker.time + CLOCK_SKEW_S - 60)
