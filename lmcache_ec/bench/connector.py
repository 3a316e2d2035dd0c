"""The vLLM connector's hot paths, next to vLLM's ``ECExampleConnector`` in the same run.

- ``has_cache_item``: µs per call on the scheduler side, for items ready to
  load and for unknown items. Baseline: ``ECExampleConnector.has_cache_item``
  (one ``os.path.exists`` plus ``makedirs`` per call) on the same machine.
- ``ensure_cache_available`` path (``TierIndex.lookup``): µs per lookup of an
  item on the disk tier (one ``stat``) and of an item already indexed.
- ``save_caches``: time for the call to return (hand-off to the writer
  thread) vs. the time of the ``ECCache.put`` it hands off to, measured
  directly on the same tensors; plus ``ECExampleConnector.save_caches``
  (synchronous safetensors write) as vLLM's baseline.

Needs vLLM and a model directory with a ``config.json`` and processor files
(no weights); the test suite's ``tests/vllm/data/tiny-blip2`` works::

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 python -m lmcache_ec.bench.connector \\
        tests/vllm/data/tiny-blip2
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

from .subjects import NO_MODEL


def _hash(n: int, tag: str) -> str:
    return hashlib.sha256(f"{tag}-{n}".encode()).hexdigest()


def _per_call_us(fn: Any, args: list[Any]) -> float:
    started = time.perf_counter()
    for arg in args:
        fn(arg)
    return 1e6 * (time.perf_counter() - started) / len(args)


def _vllm_config(model_dir: str, connector: str, extra: dict[str, Any]) -> Any:
    from vllm.config import ECTransferConfig, ModelConfig, VllmConfig

    model = ModelConfig(model=model_dir, tokenizer=model_dir, max_model_len=256, dtype="bfloat16")
    return VllmConfig(
        model_config=model,
        ec_transfer_config=ECTransferConfig(
            ec_connector=connector, ec_role="ec_both", ec_connector_extra_config=extra
        ),
    )


def bench_connector(
    model_dir: str,
    *,
    items: int = 2000,
    saves: int = 40,
    shape: tuple[int, int] = (256, 2560),
    workdir: str | None = None,
) -> dict[str, Any]:
    """Measure the connector; returns a JSON-ready dict of medians and ratios."""
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    from vllm.distributed.ec_transfer.ec_connector.example_connector import ECExampleConnector

    from ..integration.vllm.connector import LMCacheECTierConnector

    workdir = workdir or tempfile.mkdtemp(prefix="ec-bench-connector-")
    disk = os.path.join(workdir, "disk")
    os.makedirs(disk, exist_ok=True)
    tier = {"max_local_cpu_size": 1.0, "local_disk": disk, "max_local_disk_size": 5.0}
    ours_config = _vllm_config(
        model_dir, "LMCacheECTierConnector", {"lmcache_config": tier, **NO_MODEL}
    )
    example_config = _vllm_config(
        model_dir, "ECExampleConnector", {"shared_storage_path": os.path.join(workdir, "ex")}
    )
    result: dict[str, Any] = {"items": items, "saves": saves, "shape": list(shape)}

    # -- scheduler side ---------------------------------------------------------
    scheduler = LMCacheECTierConnector(ours_config, ECConnectorRole.SCHEDULER)
    example = ECExampleConnector(example_config, ECConnectorRole.SCHEDULER)
    ready = [_hash(n, "ready") for n in range(items)]
    unknown = [_hash(n, "unknown") for n in range(items)]
    scheduler.scheduler.mark_ready(ready)  # as after the workers' staging reports
    runs: dict[str, list[float]] = {"ready": [], "unknown": [], "example": []}
    for _ in range(5):
        runs["ready"].append(_per_call_us(scheduler.has_cache_item, ready))
        runs["unknown"].append(_per_call_us(scheduler.has_cache_item, unknown))
        runs["example"].append(_per_call_us(example.has_cache_item, unknown[:200]))
    index = scheduler.scheduler.index
    on_disk = [_hash(n, "disk") for n in range(200)]
    for identifier in on_disk:
        with open(os.path.join(disk, index.storage_name(identifier) + ".pt"), "wb") as stream:
            stream.write(b"x")
    first_lookup = _per_call_us(index.lookup, on_disk)  # one stat each, then remembered
    indexed_lookup = _per_call_us(index.lookup, on_disk)
    scheduler.shutdown()
    ours_hit = statistics.median(runs["ready"])
    ours_miss = statistics.median(runs["unknown"])
    example_us = statistics.median(runs["example"])
    result["has_cache_item_us"] = {
        "ready": round(ours_hit, 3),
        "unknown": round(ours_miss, 3),
        "ECExampleConnector": round(example_us, 3),
        "speedup_vs_example": round(example_us / max(ours_miss, 1e-9), 1),
    }
    result["index_lookup_us"] = {
        "disk_stat": round(first_lookup, 3),
        "indexed": round(indexed_lookup, 3),
    }

    # -- worker side ------------------------------------------------------------
    worker = LMCacheECTierConnector(ours_config, ECConnectorRole.WORKER)
    example_worker = ECExampleConnector(example_config, ECConnectorRole.WORKER)
    tensors = {
        _hash(n, "save"): torch.randn(*shape, dtype=torch.float32).to(torch.bfloat16)
        for n in range(saves)
    }
    returns = []
    for identifier in tensors:
        started = time.perf_counter()
        worker.save_caches(tensors, identifier)
        returns.append(time.perf_counter() - started)
    assert worker.worker.flush(120)
    stats = worker.worker.cache.stats.snapshot()
    put_total = stats["put_seconds"] / max(stats["puts"], 1)
    direct = []
    cache = worker.worker.cache
    for n, tensor in enumerate(tensors.values()):
        started = time.perf_counter()
        cache.put(_hash(n, "direct"), tensor)
        direct.append(time.perf_counter() - started)
    example_times = []
    for identifier in list(tensors)[: max(5, saves // 4)]:
        started = time.perf_counter()
        example_worker.save_caches(tensors, identifier)
        example_times.append(time.perf_counter() - started)
    worker.shutdown()
    save_return = statistics.median(returns)
    put_direct = statistics.median(direct)
    example_save = statistics.median(example_times)
    result["save_caches_ms"] = {
        "return": round(1e3 * save_return, 4),
        "put_in_writer_thread_mean": round(1e3 * put_total, 4),
        "put_direct": round(1e3 * put_direct, 4),
        "ECExampleConnector_sync": round(1e3 * example_save, 4),
        "put_direct_over_return": round(put_direct / max(save_return, 1e-12), 1),
        "example_over_return": round(example_save / max(save_return, 1e-12), 1),
    }
    return result


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit("usage: python -m lmcache_ec.bench.connector MODEL_DIR")
    print(json.dumps(bench_connector(args[0]), indent=2))


if __name__ == "__main__":
    main()
