"""LMCache's LocalCPUBackend, with a lazily touched pool and LRU on hits.

Upstream refreshes recency only for keys pinned by a KV lookup
(``touch_cache``); a plain ``get_blocking`` hit leaves the order untouched,
which makes the CPU tier FIFO for encoder outputs.
"""

from __future__ import annotations

from typing import Any

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.cache_policy.lru import LRUCachePolicy
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

from .allocator import HostPoolAllocator


class ECLocalCPUBackend(LocalCPUBackend):
    _lru: bool | None = None  # is the policy plain LRU (decided on first use)

    def initialize_allocator(self, config: Any, metadata: Any = None) -> HostPoolAllocator:
        return HostPoolAllocator(int(config.max_local_cpu_size * 1024**3))

    @property
    def capacity(self) -> int:
        return self.memory_allocator.size

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        lru = self._lru
        if lru is None:
            self._lru = lru = type(self.cache_policy) is LRUCachePolicy
        with self.cpu_lock:
            memory_obj = self.hot_cache.get(key)
            if memory_obj is None:
                return None
            memory_obj.ref_count_up()
            if lru:
                # What LRUCachePolicy.update_on_hit does, without its KV-chunk
                # reuse statistics (a clock read and a stats lock per hit).
                self.hot_cache.move_to_end(key)
            else:
                self.cache_policy.update_on_hit(key, self.hot_cache)
            return memory_obj

    def entries(self) -> list[tuple[CacheEngineKey, int]]:
        """(key, bytes) of every entry, least recently used first."""
        with self.cpu_lock:
            return [(k, obj.get_physical_size()) for k, obj in self.hot_cache.items()]

    def used_bytes(self) -> int:
        return self.memory_allocator.pin_allocator.total_allocated_size
