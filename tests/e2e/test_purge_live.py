"""``lmcache-ec purge`` by two tenants at once, through a real ``vllm serve`` on Redis.

A served engine has one namespace (the connector's identity), so the tenants
are one ``vllm serve`` in namespace ``a`` and library engines (``ECCache`` in
this process) in namespaces ``b`` and ``c``, all on one Redis, each with its
own disk directory. Tenants ``a`` and ``b`` run ``lmcache-ec purge
--namespace`` at the same moment. Afterwards tenant a's image is served from
no tier:

- Redis: a library reader with the served engine's identity (read from the
  entry's header), which loaded the image before the purge, misses it after;
- the server's own disk directory, which ``purge`` never touches, is emptied
  by the running engine (it applied the purge to its private tiers);
- the server's CPU tier: its worker reports the purge it applied
  (``vllm:lmcache_ec_purges_seen_total`` on its ``/metrics``);

tenant b's entry is gone from every tier, and tenant c's is still served.

(The server is not asked the image again: in one process vLLM's own encoder
cache and the connector's record of it answer, whatever the tiers hold.)

One server of its own, started with the fleet's readers; the waits are the
documented bound (``purge_check_s`` + ``remote_timeout``) plus a grace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from lmcache_ec import ECCache
from lmcache_ec.bench.vllm_server import (
    VLLMServer,
    chat_with_image,
    ec_transfer_config,
    metric_total,
    read_metrics,
)
from lmcache_ec.config import load_config
from lmcache_ec.purge.inventory import Selector, scan_remote
from lmcache_ec.remote.catalog import open_catalog

from .conftest import Site, ask, companion, counters, settled_counters

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

IMAGE = 201  # asked of this server only
INTERVAL = 0.5  # purge_check_s of every engine here
REMOTE_TIMEOUT = 5.0
CLI = str(Path(sys.executable).parent / "lmcache-ec")


def _tenant_a_server(site: Site) -> tuple[VLLMServer, tuple[dict[str, str], Path]]:
    run = os.urandom(4).hex()  # namespaces of this run only: the fleet shares the Redis
    names = {tenant: f"tenant-{tenant}-{run}" for tenant in "abc"}
    ec = {
        "local_cpu": True,
        "max_local_cpu_size": 0.25,
        "local_disk": str(site.root / "disk-a"),
        "max_local_disk_size": 1.0,
        "namespace": names["a"],
        "remote_url": site.redis_url,
        "remote_timeout": REMOTE_TIMEOUT,
        "purge_check_s": INTERVAL,
    }
    server = site.server("tenant_a", ec_transfer_config("ec_both", ec, remote_lookup_timeout_s=2.0))
    return server, (names, site.root / "disk-a")


companion("tenant_a")(_tenant_a_server)  # started with the fleet's readers (conftest.py)


@pytest.fixture(scope="module")
def tenants(fleet, redis_server) -> Iterator[dict]:
    root = Path(tempfile.mkdtemp(prefix="lmcache-ec-e2e-purge-"))
    names, disk_a = fleet.companions["tenant_a"]
    server = fleet.servers["tenant_a"]
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "max_local_disk_size": 0.5,
        "remote_url": redis_server.url,
        "remote_timeout": REMOTE_TIMEOUT,
        "purge_check_s": INTERVAL,
    }
    engines: dict[str, ECCache] = {}
    try:
        for tenant in "bc":
            engines[tenant] = ECCache.from_config(
                {**config, "local_disk": str(root / f"disk-{tenant}")},
                model="org/library-model",
                namespace=names[tenant],
            )
        purger = root / "purger.yaml"
        purger.write_text(
            yaml.safe_dump({"ec": {**config, "local_disk": str(root / "disk-purger")}})
        )
        yield {
            "server": server,
            "engines": engines,
            "names": names,
            "purger": str(purger),
            "disk_a": str(disk_a),
        }
    finally:
        for engine in engines.values():
            engine.close()
        shutil.rmtree(root, ignore_errors=True)


def _purge_at_once(purger: str, namespaces: list[str]) -> list[str]:
    """``lmcache-ec purge --namespace`` for each namespace, all started together."""
    processes = [
        subprocess.Popen(
            [CLI, "purge", "--config", purger, "--namespace", namespace],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR", "COLUMNS": "200"},
        )
        for namespace in namespaces
    ]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, (out, err)
        outputs.append(out)
    return outputs


def _reader_of_the_served_entry(purger: str, namespace: str) -> tuple[ECCache, str]:
    """A library engine with the served engine's identity (from the header of its
    one entry in Redis), and the entry's mm_hash."""
    config = load_config(purger)
    with open_catalog(config) as catalog:
        (entry,) = scan_remote(catalog, Selector(namespace=namespace))
        header = catalog.read_header(entry.name)
    assert header is not None
    identity = {k: header[k] for k in ("model", "revision", "fingerprint", "dtype", "weights")}
    reader = ECCache.from_config(replace(config, local_disk=None), namespace=namespace, **identity)
    assert reader.key(header["mm_hash"]).storage_name == entry.name
    return reader, header["mm_hash"]


def test_two_tenants_purge_at_once_and_neither_purged_image_is_served(tenants):
    server, engines, names = tenants["server"], tenants["engines"], tenants["names"]
    tensors = {t: torch.full((4, 8), float(i), dtype=torch.bfloat16) for i, t in enumerate("bc")}
    disk_a = Path(tenants["disk_a"])

    # Tenant a's image: encoded and stored by the server, servable from Redis.
    before = counters(server)
    ask(server, IMAGE)
    change = settled_counters(server, before, 1)
    assert (change["saves"], change["loads"]) == (1, 0), repr(change)
    _wait_for(lambda: list(disk_a.glob("*.pt")), "the served engine's disk entry")
    reader, mm_hash = _reader_of_the_served_entry(tenants["purger"], names["a"])
    engines["a-reader"] = reader
    assert reader.get(mm_hash) is not None
    # Tenants b and c: entries in their CPU tiers, disks and Redis.
    for tenant in "bc":
        assert engines[tenant].put("image", tensors[tenant])
        assert engines[tenant].flush(30)
        assert engines[tenant].contains("image") == "cpu"

    outputs = _purge_at_once(tenants["purger"], [names["a"], names["b"]])
    for out in outputs:
        assert "remote: deleted 1 entries" in out, out
        assert "recorded in the purge log on" in out, out
    # The documented bound for a purge that reaches an engine through the remote
    # tier, then a grace for a loaded machine.
    time.sleep(INTERVAL + REMOTE_TIMEOUT)
    _wait_for(lambda: not list(disk_a.glob("*.pt")), "the served engine purged its disk")
    for engine in (engines["b"], reader):
        _wait_for(lambda e=engine: e.stats.snapshot()["purges_seen"] >= 1, "a library purge")
    # The worker's stats travel with engine steps: a text request makes some.
    _wait_for(lambda: _worker_reported_a_purge(server), "the server's worker purge", 120.0)

    # Tenant a: in no tier (Redis, the server's disk and CPU tier: above).
    assert reader.get(mm_hash) is None and reader.contains(mm_hash) is None
    with open_catalog(load_config(tenants["purger"])) as catalog:
        assert scan_remote(catalog, Selector(namespace=names["a"])) == []
    # Tenant b: gone from every tier; tenant c: still served, from its CPU tier.
    assert engines["b"].get("image") is None
    assert engines["b"].contains("image") is None
    got = engines["c"].get("image")
    assert got is not None and torch.equal(got, tensors["c"])
    assert engines["c"].stats.snapshot()["purges_seen"] == 0
    assert engines["c"].contains("image") == "cpu"


def _worker_reported_a_purge(server: VLLMServer) -> bool:
    """The purge counter the worker's stats carry to ``/metrics`` (cumulative:
    however vLLM groups the reports into its logged intervals)."""
    chat_with_image(server.base_url, server.served_model, None, max_tokens=2)
    page = read_metrics(server.metrics_url)
    return metric_total(page, "vllm:lmcache_ec_purges_seen_total") >= 1


def _wait_for(condition, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)
