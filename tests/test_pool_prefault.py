"""The CPU pool's pages are made resident ahead of its allocations, never rewritten."""

from __future__ import annotations

import time

import torch
from lmcache.v1.memory_management import MemoryFormat

from lmcache_ec.tiers.allocator import HostPoolAllocator

MB = 1 << 20


def _wait(condition, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _rss() -> int:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * 4096


def _allocate(pool: HostPoolAllocator, size: int):
    return pool.allocate(torch.Size([size]), torch.uint8, MemoryFormat.EC_TD)


def test_a_window_ahead_of_the_first_allocation_becomes_resident():
    before = _rss()
    pool = HostPoolAllocator(256 * MB, prefault_ahead=32 * MB)
    try:
        assert pool.prefaulter is not None
        assert _wait(lambda: pool.prefaulter.populated >= 32 * MB - 4096)
        assert _rss() - before >= 24 * MB  # made resident, not merely counted
        assert pool.prefaulter.populated <= 32 * MB  # and no further: RSS follows use
    finally:
        pool.close()


def test_allocations_move_the_window_and_written_bytes_survive_it():
    pool = HostPoolAllocator(128 * MB, prefault_ahead=8 * MB)
    try:
        # Bytes written where the window has not been yet: populating must keep them.
        pattern = torch.arange(MB, dtype=torch.int64).to(torch.uint8)
        pool.buffer[40 * MB : 41 * MB].copy_(pattern)
        held = [_allocate(pool, 4 * MB) for _ in range(12)]  # up to 48 MB
        assert all(obj is not None for obj in held)
        assert _wait(lambda: pool.prefaulter.populated >= 48 * MB)
        assert torch.equal(pool.buffer[40 * MB : 41 * MB], pattern)
        assert pool.prefaulter.populated <= 128 * MB
    finally:
        pool.close()


def test_the_window_never_passes_the_pool():
    pool = HostPoolAllocator(16 * MB, prefault_ahead=64 * MB)
    try:
        assert _wait(lambda: pool.prefaulter.populated >= 16 * MB - 4096)
        assert pool.prefaulter.populated <= 16 * MB
        assert _allocate(pool, 16 * MB) is not None
    finally:
        pool.close()


def test_close_stops_the_thread():
    pool = HostPoolAllocator(64 * MB, prefault_ahead=8 * MB)
    pool.close()
    thread = pool.prefaulter._thread
    assert thread is not None
    assert _wait(lambda: not thread.is_alive())


def test_no_prefault_when_disabled():
    pool = HostPoolAllocator(8 * MB, prefault_ahead=0)
    assert pool.prefaulter is None
    assert _allocate(pool, MB) is not None
    pool.close()
