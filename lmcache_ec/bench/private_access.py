"""The only place the benchmarks touch private state, each access with why.

Every access here is to LMCache 0.5.6's ``ECCacheEngine`` (the baseline) or to
lmcache-ec's vLLM connector; lmcache-ec's ``ECCache`` itself is measured
through its public calls only (its node tier's reads excepted: ``node_tier``).
Upstream names relied on (pinned by the tests of upstream behaviour):
``ECCacheEngine._storage_manager``, ``ECCacheEngine._make_cache_key``,
``StorageManager.storage_backends``, ``LocalDiskBackend.disk_worker.put_lock``/
``put_tasks``; the backends' public ``get_blocking`` and
``MemoryObj.ref_count_down`` are used as ``ECCache`` uses them.
"""

from __future__ import annotations

from typing import Any

import torch


def upstream_metadata(model: str) -> Any:
    """The ``LMCacheMetadata`` ``ECCache`` builds its tiers with, so both engines
    are configured alike. ``engine._lmcache_metadata`` is not public API."""
    from ..engine import _lmcache_metadata

    return _lmcache_metadata(model)


def upstream_key(engine: Any, mm_hash: str) -> Any:
    # ECCacheEngine exposes no key function; its put/get build keys this way.
    return engine._make_cache_key(mm_hash)


def upstream_walk(engine: Any, mm_hash: str, like: torch.Tensor) -> torch.Tensor | None:
    """Upstream's tier walk (``StorageManager.get``) and a copy out, as its ``get`` does.

    ``ECCacheEngine.get`` reads only its first backend; the walk is the only way
    its disk and remote tiers answer at all.
    """
    return _copy_out(engine._storage_manager.get(upstream_key(engine, mm_hash)), like)


def upstream_cpu_read(engine: Any, mm_hash: str, like: torch.Tensor) -> torch.Tensor | None:
    """The least a read through LMCache's CPU backend does: lookup and hold
    (``get_blocking``), one copy out, release. ``ECCache``'s CPU tier is that
    backend, so this is the floor of its CPU hit; ``ECCacheEngine.get`` adds its
    own batching above it."""
    cpu = engine._storage_manager.storage_backends["LocalCPUBackend"]
    return _copy_out(cpu.get_blocking(upstream_key(engine, mm_hash)), like)


def _copy_out(memory_obj: Any, like: torch.Tensor) -> torch.Tensor | None:
    """A held buffer copied out as ``like``'s dtype and shape, then released."""
    if memory_obj is None:
        return None
    try:
        return memory_obj.tensor.view(like.dtype).view(like.shape).clone()
    finally:
        memory_obj.ref_count_down()


def upstream_remove(engine: Any, mm_hash: str) -> None:
    # ECCacheEngine has no remove(); its StorageManager does.
    engine._storage_manager.remove(upstream_key(engine, mm_hash))


def upstream_disk_idle(engine: Any) -> bool:
    """True when upstream's disk writes are done: it has no flush()."""
    disk = engine._storage_manager.storage_backends.get("LocalDiskBackend")
    if disk is None:
        return True
    with disk.disk_worker.put_lock:
        return not disk.disk_worker.put_tasks


def upstream_drop_cpu(engine: Any, mm_hashes: list[str]) -> None:
    """Remove entries from upstream's CPU backend only, so its next read walks the
    tiers below (its tier walk promotes even with ``local_cpu: false``); it has no
    per-tier remove."""
    cpu = engine._storage_manager.storage_backends["LocalCPUBackend"]
    for mm_hash in mm_hashes:
        cpu.remove(upstream_key(engine, mm_hash), force=True)


def upstream_remote_names(engine: Any, mm_hash: str) -> list[str]:
    """The Redis keys upstream writes for ``mm_hash`` (to see when its upload landed)."""
    name = upstream_key(engine, mm_hash).to_string()
    return [name + "kv_bytes", name + "metadata"]


def node_tier(cache: Any) -> Any:
    """``ECCache``'s node tier: ``bench node-reads`` reads its frames directly, to
    time the read and verification apart from the rest of ``get``."""
    return cache._storage.node


def mark_staged(scheduler_connector: Any, identifiers: list[str]) -> None:
    """Mark items staged on the scheduler side, as the workers' staging reports do.

    Producing real reports needs a worker that staged each item; the lookup
    cost measured does not depend on how the items got there.
    """
    scheduler_connector.scheduler.mark_ready(identifiers)
