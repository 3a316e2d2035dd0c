"""A closed cache gives its CPU pool back: nothing of LMCache's keeps it.

LMCache's process-wide Prometheus logger (one per model name, never dropped)
would hold gauges closing over the CPU backend and the storage manager, and
with them the pool: a process opening and closing caches for N models kept N
pools resident.
"""

from __future__ import annotations

import gc
import weakref

import torch

from lmcache_ec import ECCache


def _pool_of_a_closed_cache(disk_dir, model: str) -> weakref.ref:
    cache = ECCache.from_config(
        {"max_local_cpu_size": 0.01, "local_disk": str(disk_dir)}, model=model
    )
    cache.put("a", torch.ones(8, 16))
    assert cache.get("a") is not None
    pool = weakref.ref(cache._storage.cpu.memory_allocator.buffer)
    cache.close()
    return pool


def test_a_closed_cache_gives_its_cpu_pool_back(tmp_path):
    pools = [_pool_of_a_closed_cache(tmp_path / "d", f"org/pool-{n}") for n in range(2)]
    gc.collect()
    assert [pool() for pool in pools] == [None, None]
