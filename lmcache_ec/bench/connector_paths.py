"""The vLLM connector's hot paths, with a remote tier configured, next to the baselines.

Scheduler side (µs per item, timed in chunks of ``CHUNK`` calls):

  ``has_cache_item, ready``    items the workers reported staged (an in-memory answer).
  ``has_cache_item, unknown``  items nobody has seen.
  ``tier lookup, first sight`` ``TierIndex.lookup`` of a new item, as
                               ``ensure_cache_available`` does: the disk listing
                               (kept by a background thread), then the remote
                               question queued to another.
  ``tier lookup, answered``    the same items once the background thread answered.

  Upstream: ``ECCacheEngine.contains`` on the same tiers (what its vLLM adapter's
  ``has_cache_item`` calls; it asks the remote store synchronously).
  Example: ``ECExampleConnector.has_cache_item`` (a file-exists check).

Worker side: ``save_caches`` return time (ours hands the tensor to a writer
thread) vs upstream's ``ECCacheEngine.put`` (its adapter's ``save_caches``) and
the example connector's synchronous safetensors write.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from .measure import summary
from .private_access import mark_staged
from .rows import OURS, make_row, pool_gb, sample_tensors
from .subjects import (
    NO_MODEL,
    TINY_MODEL_DIR,
    ExampleConnector,
    close_bounded,
    open_upstream,
    vllm_config,
)

CHUNK = 100
UP, EX = "upstream", "example"


def _ids(tag: str, count: int) -> list[str]:
    # Content hashes (hex), as vLLM's mm_hash: the connector persists only those.
    return [hashlib.sha256(f"{tag}-{i}".encode()).hexdigest() for i in range(count)]


def _chunks(calls: dict[str, tuple[Callable[[str], Any], list[str]]]) -> dict[str, list[float]]:
    """Seconds per chunk of ``CHUNK`` calls, engines interleaved chunk by chunk."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    count = min(len(items) for _, items in calls.values()) // CHUNK
    for c in range(count):
        for name in names if c % 2 == 0 else reversed(names):
            fn, items = calls[name]
            chunk = items[c * CHUNK : (c + 1) * CHUNK]
            started = time.perf_counter()
            for item in chunk:
                fn(item)
            times[name].append(time.perf_counter() - started)
    return times


def run_connector(
    shape: tuple[int, int],
    dtype: torch.dtype,
    items: int,
    saves: int,
    workdir: str,
    progress: Callable[[str], None],
    *,
    remote: dict[str, Any] | None,
    remote_note: str,
    model_dir: str = TINY_MODEL_DIR,
) -> list[dict[str, Any]]:
    """Rows for the scheduler lookups and ``save_caches``.

    ``remote`` holds the ``ec:`` remote keys (``remote_url`` …) or None when no
    store is reachable (``remote_note`` then says so on every row).
    """
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole

    from ..integration.vllm.connector import LMCacheECTierConnector

    items = max(CHUNK, items // CHUNK * CHUNK)
    tensors = sample_tensors(shape, dtype)
    nbytes = tensors[0].numel() * tensors[0].element_size()
    disk = os.path.join(workdir, "ours")
    tier = {
        "max_local_cpu_size": pool_gb(saves + 8, nbytes),
        "local_disk": disk,
        "max_local_disk_size": max(1.0, 2 * saves * nbytes / 1024**3),
        **(remote or {}),
    }
    config = vllm_config(model_dir, "LMCacheECTierConnector", {"lmcache_config": tier, **NO_MODEL})
    up_tier = {k: v for k, v in tier.items() if k in ("max_local_cpu_size", "max_local_disk_size")}
    up_tier.update(local_cpu=True, local_disk=os.path.join(workdir, "upstream"))
    if remote and str(remote.get("remote_url", "")).startswith("redis"):
        up_tier["remote_url"] = remote["remote_url"]
        up_note = "same CPU + disk + Redis tiers; asks Redis synchronously"
    else:
        up_note = "CPU + disk tiers only (its S3 connector cannot be configured here)"
    example_dir = os.path.join(workdir, "example")
    progress("starting the connectors")
    upstream = open_upstream(up_tier, dtype)
    example = ExampleConnector(example_dir)
    rows: list[dict[str, Any]] = []
    scheduler = LMCacheECTierConnector(config, ECConnectorRole.SCHEDULER)
    example_scheduler = _example_scheduler(example_dir, model_dir)
    try:
        progress("has_cache_item")
        ready, unknown, fresh = _ids("ready", items), _ids("unknown", items), _ids("fresh", items)
        mark_staged(scheduler, ready)
        small = tensors[0][:1].clone()
        for identifier in ready:  # the baselines hold these items too
            upstream.put(identifier, small)
            example.save(identifier, small)
        index = scheduler.scheduler.index
        measured = {
            "has_cache_item, ready": _chunks(
                {
                    OURS: (scheduler.has_cache_item, ready),
                    UP: (upstream.contains, ready),
                    EX: (example_scheduler.has_cache_item, ready),
                }
            ),
            "has_cache_item, unknown": _chunks(
                {
                    OURS: (scheduler.has_cache_item, unknown),
                    UP: (upstream.contains, unknown),
                    EX: (example_scheduler.has_cache_item, unknown),
                }
            ),
            "tier lookup, first sight": _chunks(
                {
                    OURS: (index.lookup, fresh),
                    UP: (upstream.contains, fresh),
                    EX: (example_scheduler.has_cache_item, fresh),
                }
            ),
        }
        deadline = time.monotonic() + 60
        for identifier in fresh:
            index.wait_answer(identifier, max(0.0, deadline - time.monotonic()))
        measured["tier lookup, answered"] = _chunks(
            {
                OURS: (index.lookup, fresh),
                UP: (upstream.contains, fresh),
                EX: (example_scheduler.has_cache_item, fresh),
            }
        )
        notes = {
            "has_cache_item, ready": "staged items: a set lookup",
            "has_cache_item, unknown": "",
            "tier lookup, first sight": "disk listing; remote question queued (background)",
            "tier lookup, answered": "remote answers remembered",
        }
        for op, times in measured.items():
            note = "; ".join(
                filter(None, [notes[op], remote_note, f"timed {CHUNK} calls at a time"])
            )
            rows.append(
                make_row(
                    "scheduler",
                    op,
                    None,
                    None,
                    None,
                    ours=summary(
                        "LMCacheECTierConnector" if "has_cache" in op else "TierIndex.lookup",
                        times[OURS],
                        0,
                        per_call_items=CHUNK,
                        note=note,
                    ),
                    upstream=summary(
                        "ECCacheEngine.contains", times[UP], 0, per_call_items=CHUNK, note=up_note
                    ),
                    example=summary(
                        "ECExampleConnector.has_cache_item",
                        times[EX],
                        0,
                        per_call_items=CHUNK,
                        note="os.path.exists (+ makedirs)",
                    ),
                )
            )
    finally:
        scheduler.shutdown()

    progress("save_caches")
    worker = LMCacheECTierConnector(config, ECConnectorRole.WORKER)
    try:
        ids = _ids("save", saves)
        cache = {identifier: tensors[i % len(tensors)] for i, identifier in enumerate(ids)}
        times: dict[str, list[float]] = {OURS: [], UP: [], EX: []}
        calls: dict[str, Callable[[str], Any]] = {
            OURS: lambda identifier: worker.save_caches(cache, identifier),
            UP: lambda identifier: upstream.put(identifier, cache[identifier]),
            EX: lambda identifier: example.save(identifier, cache[identifier]),
        }
        names = list(calls)
        for i, identifier in enumerate(ids):
            for name in names if i % 2 == 0 else reversed(names):
                started = time.perf_counter()
                calls[name](identifier)
                times[name].append(time.perf_counter() - started)
            # Writes finish between items: each save is timed on a quiet machine.
            worker.worker.flush(120)
        stored = worker.worker.cache.stats.snapshot()["puts"]
        rows.append(
            make_row(
                "connector",
                "save_caches",
                shape,
                dtype,
                nbytes,
                ours=summary(
                    "LMCacheECTierConnector.save_caches",
                    times[OURS],
                    nbytes,
                    note=f"hands off to a writer thread; {stored}/{saves} stored after flush",
                    stored=stored,
                ),
                upstream=summary(
                    "ECCacheEngine.put",
                    times[UP],
                    nbytes,
                    note="what its vLLM adapter's save_caches calls",
                ),
                example=summary(
                    "ECExampleConnector.save_caches", times[EX], nbytes, note="synchronous"
                ),
                note=remote_note,
            )
        )
    finally:
        worker.shutdown()
        close_bounded(upstream, 0.5)
    return rows


def _example_scheduler(directory: str, model_dir: str) -> Any:
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    from vllm.distributed.ec_transfer.ec_connector.example_connector import ECExampleConnector

    config = vllm_config(model_dir, "ECExampleConnector", {"shared_storage_path": directory})
    return ECExampleConnector(config, ECConnectorRole.SCHEDULER)
