"""The CPU tier's memory pool.

LMCache's ``MixedMemoryAllocator`` zero-fills its whole pool at start-up on a
CPU-only host (seconds and GBs of RSS for the 5 GB default) and pins it with
the accelerator runtime otherwise. ``HostPoolAllocator`` keeps the same
allocation scheme (``TensorMemoryAllocator`` over one flat buffer) but takes
the buffer from ``torch.empty``: pages are touched when entries are written,
so an idle tier costs nothing. With an accelerator the pool is page-locked,
as upstream does, for fast host-to-device copies.
"""

from __future__ import annotations

import threading

import torch
from lmcache import torch_dev
from lmcache.v1.memory_allocators.buffer_allocator import BufferAllocator
from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
from lmcache.v1.memory_management import AddressManager


class HostPoolAllocator(MixedMemoryAllocator):
    def __init__(self, size: int) -> None:
        # Deliberately not calling super().__init__: it allocates the pool.
        self.numa_mapping = None
        self.use_hugepages = False
        self.shm_name = None
        self.align_bytes = AddressManager.ALIGN_BYTES
        self.size = size
        self.buffer = torch.empty(size, dtype=torch.uint8, pin_memory=torch_dev.is_available())
        self._unregistered = False
        self.pin_allocator = TensorMemoryAllocator(self.buffer, align_bytes=self.align_bytes)
        self.host_mem_lock = threading.Lock()
        self.buffer_allocator = BufferAllocator("cpu")

    def close(self) -> None:
        # The buffer is an ordinary tensor: entries still referenced keep it
        # alive, and it is released with the last of them.
        self._unregistered = True

    def __str__(self) -> str:
        return "HostPoolAllocator"
