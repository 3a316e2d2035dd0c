"""The CPU tier's memory pool.

LMCache's ``MixedMemoryAllocator`` zero-fills its whole pool at start-up on a
CPU-only host (seconds and GBs of RSS for the 5 GB default) and pins it with
the accelerator runtime otherwise. ``HostPoolAllocator`` keeps the same
allocation scheme (``TensorMemoryAllocator`` over one flat buffer) but takes
the buffer from ``torch.empty``: pages are touched when entries are written,
so an idle tier costs nothing. With an accelerator the pool is page-locked,
as upstream does, for fast host-to-device copies.

It stays a ``MixedMemoryAllocator`` (LMCache's ``LocalCPUBackend`` asserts
that type before evicting for a batch) built by its own constructor with an
empty arena; only the arena (``buffer``, ``size``, ``pin_allocator``) is ours.
"""

from __future__ import annotations

import torch
from lmcache import torch_dev
from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator


class HostPoolAllocator(MixedMemoryAllocator):
    def __init__(self, size: int) -> None:
        super().__init__(0)  # a zero-byte arena costs nothing; ours replaces it
        self.size = size
        self.buffer = torch.empty(size, dtype=torch.uint8, pin_memory=torch_dev.is_available())
        self.pin_allocator = TensorMemoryAllocator(self.buffer, align_bytes=self.align_bytes)

    def used_bytes(self) -> int:
        """Bytes handed out (aligned sizes), freed or not yet reused excluded."""
        return self.pin_allocator.total_allocated_size

    def close(self) -> None:
        # Not upstream's: it frees the arena with the allocator it came from.
        # Ours is an ordinary tensor: entries still referenced keep it alive,
        # and it is released with the last of them.
        return None

    def __str__(self) -> str:
        return "HostPoolAllocator"
