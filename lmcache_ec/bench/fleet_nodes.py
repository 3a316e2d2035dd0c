"""One process of a benchmark fleet (``bench fleet`` and ``bench fleet --api``),
run in a job process: the shared start barrier, the stop flag, and each
form's node. Nothing here starts processes (``fleet.py`` does), so the job
process imports this without importing what starts it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

Progress = Callable[[str], None]
BARRIER_TIMEOUT = 300.0
RUN_TIMEOUT = 900.0
THREADS_PER_PROCESS = 8  # --api: requests a node serves at once


def run_node(job: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """One engine of the fleet: its share of the stream, on the shared clock."""
    import redis
    import torch

    from ..integration.vllm.plugin import register
    from .steps import SimEngine, StepBenchSettings, sim_item, sim_vllm_config
    from .subjects import TINY_MODEL_DIR

    register()  # what vLLM's plugin loading does in a served engine
    node, nodes = int(job["node"]), int(job["nodes"])
    vllm_config = sim_vllm_config(
        TINY_MODEL_DIR,
        1024,
        {
            "lmcache_config": job["ec"],
            "remote_lookup_timeout_s": 1.0,
            **job.get("claims", {}),
        },
    )
    # The simulated runner calls the connector in idle steps too, as vLLM's V2
    # runner does (set after the config: VllmConfig refuses V2 without Triton).
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    item = sim_item(vllm_config, tuple(job["shape"]), torch.Generator().manual_seed(1))
    steps = StepBenchSettings(
        model_dir=TINY_MODEL_DIR, encode_ms=job["encode_ms"], forward_ms=job["forward_ms"]
    )
    engine = SimEngine(vllm_config, steps, item)
    mine = [
        (j, j * job["interval_ms"] / 1000, image)
        for j, image in enumerate(job["stream"])
        if j % nodes == node
    ]
    client = redis.Redis.from_url(job["barrier_url"])
    try:
        start = barrier(client, job["run"], nodes)
        progress(f"node {node}: started")
        arrived: list[str] = []
        reported = 0
        deadline = time.monotonic() + RUN_TIMEOUT
        checked = time.monotonic()
        pending = list(mine)
        while pending or not all(r in engine.finished for r in arrived):
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {node}: requests did not finish in {RUN_TIMEOUT:.0f} s")
            if time.monotonic() - checked > 0.5:  # the parent was interrupted, or a node failed
                checked = time.monotonic()
                check_stop(client, job["run"])
            now = time.time() - start
            while pending and pending[0][1] <= now:
                j, _, image = pending.pop(0)
                engine.add(f"req-{j}", [image], max_tokens=2)
                arrived.append(f"req-{j}")
            if all(r in engine.finished for r in arrived) and pending:
                time.sleep(max(0.0, min(pending[0][1] - now, 0.05)))
                continue
            engine.step()
            if len(arrived) >= reported + 50:
                reported = len(arrived)
                progress(f"node {node}: {reported}/{len(mine)} requests")
        cache = engine.worker.worker.cache
        engine.worker.worker.flush(120)
        stats = cache.stats.snapshot()
        images = sorted(set(job["stream"]))
        held = {image: cache.contains(image) for image in images}
        resident = [image for image, tier in held.items() if tier == "cpu"]
        encoded = set(engine.encode_requests)
        return {
            "node": node,
            "requests": len(mine),
            "finished": sum(r in engine.finished for r in arrived),
            "encodes": len(engine.encode_requests),
            "hits": sum(r not in encoded for r in arrived if r in engine.finished),
            "unique_images": len({image for _, _, image in mine}),
            "tier_hits": dict(stats["hits"]),
            "puts": stats["puts"],
            "put_bytes": stats["bytes_in"],
            "uploads": int(stats["tiers"].get("remote", {}).get("uploads", 0)),
            "cpu_resident": resident,
            "node_resident": [image for image, tier in held.items() if tier == "node"],
            "connector": {k: v for k, v in engine.stats.items() if v},
            "storage_prefix": cache.identity.storage_prefix,
        }
    finally:
        engine.shutdown()
        with contextlib.suppress(Exception):
            client.close()


def barrier(client: Any, run: str, nodes: int) -> float:
    """Wait for every process of the run; the shared start time (epoch seconds)."""
    ready = client.incr(f"{run}:ready")
    client.expire(f"{run}:ready", int(BARRIER_TIMEOUT + RUN_TIMEOUT))
    if ready >= nodes:
        client.set(f"{run}:start", repr(time.time() + 0.2), nx=True, ex=int(RUN_TIMEOUT))
    deadline = time.monotonic() + BARRIER_TIMEOUT
    while (start := client.get(f"{run}:start")) is None:
        if time.monotonic() > deadline:
            raise RuntimeError("the other fleet processes did not start")
        check_stop(client, run)
        time.sleep(0.01)
    start_at = float(start)
    time.sleep(max(0.0, start_at - time.time()))
    return start_at


def check_stop(client: Any, run: str) -> None:
    if client.exists(f"{run}:stop"):
        raise RuntimeError("stopped: the run was interrupted or another process failed")


def stop_run(redis_url: str, run: str) -> None:
    """Tell every process of ``run`` to stop (they poll for it twice a second)."""
    import redis

    with contextlib.suppress(Exception), redis.Redis.from_url(redis_url) as client:
        client.set(f"{run}:stop", "1", ex=int(RUN_TIMEOUT))


def run_api_node(job: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """One process of the fleet: its share of the stream, on the shared clock."""
    import redis
    import torch

    from ..engine import ECCache

    node, nodes, mode = int(job["node"]), int(job["nodes"]), job["mode"]
    rows, cols = job["shape"]
    item = torch.randn(rows, cols, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    encode_s = job["encode_ms"] / 1000
    mine = [
        (j * job["interval_ms"] / 1000, image)
        for j, image in enumerate(job["stream"])
        if j % nodes == node
    ]
    computed = threading.local()

    def encode() -> torch.Tensor:
        computed.value = True
        time.sleep(encode_s)
        return item.clone()

    def serve(image: str) -> tuple[float, bool]:
        """(seconds, encoded here) of one request."""
        computed.value = False
        started = time.perf_counter()
        if mode == "get_or_compute":
            cache.get_or_compute(image, encode, wait_s=job["wait_s"])
        elif cache.get(image) is None:
            cache.put(image, encode())
        return time.perf_counter() - started, computed.value

    client = redis.Redis.from_url(job["barrier_url"])
    cache = ECCache.from_config(job["ec"], model="bench/fleet-api", dtype=torch.bfloat16)
    try:
        cache.get_or_compute("warm-up", item.clone)  # store clients and claims opened
        waits_before = cache.stats.snapshot()["get_or_compute"]["waits"]
        start = barrier(client, job["run"], nodes)
        progress(f"node {node}: started ({mode})")
        with ThreadPoolExecutor(THREADS_PER_PROCESS) as pool:
            futures = []
            for at, image in mine:
                while (delay := start + at - time.time()) > 0:
                    time.sleep(min(delay, 0.05))
                futures.append(pool.submit(serve, image))
            check_stop(client, job["run"])
            served = [future.result(RUN_TIMEOUT) for future in futures]
        cache.flush(120)
        stats = cache.stats.snapshot()
        return {
            "node": node,
            "requests": len(mine),
            "encodes": sum(encoded for _, encoded in served),
            "seconds_not_encoded": [s for s, encoded in served if not encoded],
            "waits": stats["get_or_compute"]["waits"] - waits_before,
            "storage_prefix": cache.identity.storage_prefix,
        }
    finally:
        cache.close()
        with contextlib.suppress(Exception):
            client.close()
