"""``lmcache-ec bench fleet --api``: the fleet's image stream through the library API.

The stream of ``fleet.py`` (Zipf over ``images``, one request every
``interval_ms``, dealt round-robin) served by N plain processes, each an
``ECCache`` with its own CPU tier on one shared tier: Redis, S3 (moto by
default) or a disk directory all of them mount (``store="disk"``). A request
runs on a thread of its process (up to 8 at once) in one of two ways:

- ``get/put``: ``get``; on a miss a ``encode_ms`` sleep (the encoder), then ``put``;
- ``get_or_compute``: the same encoder as ``compute`` (single flight).

Reported per run: ``encodes`` (encoder runs) and ``encodes_per_unique``,
``hit_rate`` (requests not encoded for), and for ``get_or_compute`` the waits
for another instance's encode (``ECCache.stats``): ``waits`` counts them, and
``waiter_ms`` the p50/p99 of the time those requests took — taken as the
slowest requests not encoded for, as many as waited (a hit returns in well
under a millisecond, a waiter after the other instance's encode).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import uuid
from typing import Any

from .fleet import (
    FleetSettings,
    fleet_result,
    image_stream,
    raise_first_failure,
    remove_entries,
    run_nodes,
    shared_stores,
)
from .fleet_nodes import Progress

MODES = ("get/put", "get_or_compute")


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summarise_api(label: str, per_node: list[dict[str, Any]], stream: list[str]) -> dict:
    requests = sum(n["requests"] for n in per_node)
    unique = len(set(stream))
    encodes = sum(n["encodes"] for n in per_node)
    waits = sum(n["waits"] for n in per_node)
    slowest = sorted((s for n in per_node for s in n["seconds_not_encoded"]), reverse=True)
    waiters = [s * 1000 for s in slowest[:waits]]
    return {
        "label": label,
        "nodes": len(per_node),
        "requests": requests,
        "unique_images": unique,
        "encodes": encodes,
        "encodes_per_unique": encodes / unique if unique else None,
        "hits": requests - encodes,
        "hit_rate": (requests - encodes) / requests if requests else None,
        "waits": waits,
        "waiter_ms": {"p50": _percentile(waiters, 50), "p99": _percentile(waiters, 99)},
    }


def _run(
    label: str,
    nodes: int,
    mode: str,
    stream: list[str],
    settings: FleetSettings,
    stores: tuple[str, dict, dict],
    progress: Progress,
) -> dict[str, Any]:
    redis_url, remote, env = stores
    run = f"fleet-api-{uuid.uuid4().hex[:10]}"
    frame_guess = settings.shape[0] * settings.shape[1] * 2
    ec: dict[str, Any] = {
        "max_local_cpu_size": max(0.1, 2 * settings.images * frame_guess / 1024**3),
        "remote_timeout": 30.0,
        "namespace": run,  # a fresh namespace: nothing carries over between runs
    }
    shared_dir = None
    if settings.store == "disk":
        shared_dir = tempfile.mkdtemp(prefix=f"{run}-")
        ec.update(local_disk=f"{shared_dir}/disk", max_local_disk_size=ec["max_local_cpu_size"])
    else:
        ec.update(remote)
    job = {
        "job": "fleet-api-node",
        "run": run,
        "nodes": nodes,
        "mode": mode,
        "stream": stream,
        "ec": ec,
        "shape": list(settings.shape),
        "interval_ms": settings.interval_ms,
        "encode_ms": settings.encode_ms,
        "wait_s": settings.claim_wait_s,
        "barrier_url": redis_url,
    }
    try:
        results = run_nodes(label, job, nodes, env, progress)
    finally:
        if shared_dir is not None:
            shutil.rmtree(shared_dir, ignore_errors=True)
    if shared_dir is None:
        remove_entries(ec, {r["storage_prefix"] for r in results if isinstance(r, dict)})
    raise_first_failure(label, results)
    return summarise_api(label, results, stream)


def run_fleet_api(
    settings: FleetSettings, progress: Progress = lambda _: None, command: str = ""
) -> dict[str, Any]:
    """The stream through get/put and get_or_compute, on one process and on the fleet."""
    started = time.perf_counter()
    if settings.nodes < 1 or settings.requests < 1 or settings.images < 1:
        raise ValueError("nodes, requests and images must be >= 1")
    stream = image_stream(settings)
    runs: list[dict[str, Any]] = []
    # S3 and disk runs still need a Redis: it carries the start barrier.
    with shared_stores(settings, progress) as stores:
        for nodes in (1, settings.nodes) if settings.baseline else (settings.nodes,):
            for mode in MODES:
                label = f"{nodes} process{'es' if nodes > 1 else ''}, {mode}"
                runs.append(_run(label, nodes, mode, stream, settings, stores, progress))
    return fleet_result(
        "lmcache-ec-bench-fleet-api/1",
        command,
        {
            **{k: v for k, v in vars(settings).items() if k != "shape"},
            "shape": list(settings.shape),
        },
        runs,
        next((r for r in runs if r["nodes"] == 1 and r["label"].endswith(MODES[1])), None),
        started,
    )
