"""LMCache's LocalCPUBackend, with a lazily touched pool and LRU on hits.

Upstream refreshes recency only for keys pinned by a KV lookup
(``touch_cache``); a plain ``get_blocking`` hit leaves the order untouched,
which makes the CPU tier FIFO for encoder outputs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.cache_policy.lru import LRUCachePolicy
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

from ..config import from_lmcache
from ..tier_contract import TierDefaults, TierKind
from .allocator import HostPoolAllocator


class _LRUWithoutStatistics(LRUCachePolicy):
    """``LRUCachePolicy``'s order without its KV-chunk reuse statistics: they keep
    a timestamp per key and add an entry per re-put (promotion) to
    ``LMCStatsMonitor``, which only LMCache's KV stats logger (never run for
    this tier) clears: memory that grows with every put."""

    def update_on_put(self, key: Any) -> None:
        pass

    def update_on_hit(self, key: Any, cache_dict: Any) -> None:
        cache_dict.move_to_end(key)


def _without_statistics(policy: Any) -> Any:
    return _LRUWithoutStatistics() if type(policy) is LRUCachePolicy else policy


class ECLocalCPUBackend(TierDefaults, LocalCPUBackend):
    kind = TierKind.CPU
    name = "cpu"
    backend_name = "LocalCPUBackend"
    _lru: bool | None = None  # is the policy plain LRU (decided on first use)
    # Use order: every hit and put takes the next tick (see allocate_after).
    _clock = 0
    _used: dict[CacheEngineKey, int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._used = {}
        self.counters: Counter[str] = Counter()
        super().__init__(*args, **kwargs)
        self.cache_policy = _without_statistics(self.cache_policy)  # hot_cache is still empty

    memory_allocator: HostPoolAllocator

    def _setup_metrics(self) -> None:
        # Upstream's gauges hold this backend (and so the pool) in LMCache's
        # process-wide logger after close; lmcache-ec reports its own stats.
        pass

    def initialize_allocator(self, config: Any, metadata: Any = None) -> HostPoolAllocator:
        settings = from_lmcache(config)
        return HostPoolAllocator(settings.cpu_bytes, huge_pages=settings.cpu_huge_pages)

    @property
    def holds_entries(self) -> bool:
        """False with ``local_cpu`` off: the pool then only lends buffers."""
        return self.use_hot

    @property
    def capacity(self) -> int:
        return self.memory_allocator.size

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        lru = self._lru
        if lru is None:
            self._lru = lru = isinstance(self.cache_policy, LRUCachePolicy)
        with self.cpu_lock:
            memory_obj = self.hot_cache.get(key)
            if memory_obj is None:
                return None
            memory_obj.ref_count_up()
            self._clock += 1
            self._used[key] = self._clock
            if lru:
                # What LRUCachePolicy.update_on_hit does, without its KV-chunk
                # reuse statistics (a clock read and a stats lock per hit).
                self.hot_cache.move_to_end(key)
            else:
                self.cache_policy.update_on_hit(key, self.hot_cache)
            return memory_obj

    def read(self, key: CacheEngineKey) -> MemoryObj | None:
        return self.get_blocking(key)

    def read_into_pool(
        self, key: CacheEngineKey, allocate: Callable[[int], MemoryObj | None]
    ) -> MemoryObj | None:
        return self.get_blocking(key)  # already in the pool

    def allocate_frame(self, size: int) -> MemoryObj | None:
        """A pool buffer of ``size`` bytes, evicting as needed; None if there is no room now."""
        return self.allocate(torch.Size([size]), torch.uint8, MemoryFormat.EC_TD, busy_loop=False)

    def submit_put_task(self, key: CacheEngineKey, memory_obj: MemoryObj, *args: Any, **kw: Any):
        with self.cpu_lock:
            self._clock += 1
            self._used[key] = self._clock
        return super().submit_put_task(key, memory_obj, *args, **kw)

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        removed = super().remove(key, force)
        self._used.pop(key, None)
        return removed

    def stamp(self) -> int:
        """The current tick of the tier's use order."""
        return self._clock

    def allocate_after(self, size: int, since: int) -> MemoryObj | None:
        """A frame buffer for an entry last read at tick ``since``, evicting only
        entries not used after it: a late promotion never pushes out anything
        more recent than itself (nor an entry written since, which may exist
        nowhere else)."""
        while True:
            memory_obj = self.allocate(
                torch.Size([size]), torch.uint8, MemoryFormat.EC_TD, eviction=False
            )
            if memory_obj is not None or not self.use_hot:
                return memory_obj
            with self.cpu_lock:
                victims = self.cache_policy.get_evict_candidates(self.hot_cache, 1)
                if not victims or self._used.get(victims[0], 0) > since:
                    return None
                self.batched_remove(victims, force=False)

    def write_used_at(self, key: CacheEngineKey, memory_obj: MemoryObj, since: int) -> None:
        """Store a promoted frame as used at tick ``since`` (when its reader read
        it from a lower tier): behind every entry used or written after that, so
        a late promotion never outranks newer puts in the eviction order."""
        self.submit_put_task(key, memory_obj)
        with self.cpu_lock:
            if key not in self.hot_cache:
                return
            self._used[key] = since
            if not isinstance(self.cache_policy, LRUCachePolicy):
                return  # other policies keep their own order
            newer = []
            for other in reversed(self.hot_cache):  # most recently used first
                if other == key:
                    continue
                if self._used.get(other, 0) <= since:
                    break
                newer.append(other)
            for other in reversed(newer):
                self.hot_cache.move_to_end(other)

    def entries(self) -> list[tuple[CacheEngineKey, int]]:
        """(key, bytes) of every entry, least recently used first."""
        with self.cpu_lock:
            return [(k, obj.get_physical_size()) for k, obj in self.hot_cache.items()]

    def used_bytes(self) -> int:
        return self.memory_allocator.used_bytes()
