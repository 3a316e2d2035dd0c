"""The CPU pool's pages are made resident ahead of its allocations, never rewritten."""

from __future__ import annotations

import os

import pytest
import torch
from lmcache.v1.memory_management import MemoryFormat

from lmcache_ec.bench.measure import wait_until
from lmcache_ec.tiers.allocator import HostPoolAllocator

MB = 1 << 20


def _resident(buffer: torch.Tensor) -> int:
    """Resident bytes of the mapping holding ``buffer`` (its own: the pool is a
    large allocation), unmoved by what the rest of the process frees meanwhile."""
    address = buffer.data_ptr()
    inside = False
    with open("/proc/self/smaps") as stream:
        for line in stream:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                start, end = (int(bound, 16) for bound in fields[0].split("-"))
                inside = start <= address < end
            elif inside and fields[0] == "Rss:":
                return int(fields[1]) * 1024
    raise AssertionError("no mapping holds the pool")


def _allocate(pool: HostPoolAllocator, size: int):
    return pool.allocate(torch.Size([size]), torch.uint8, MemoryFormat.EC_TD)


def _release(*held) -> None:
    """Give buffers back: one left to the garbage collector is freed whenever it
    runs, in whatever test this process runs then."""
    for obj in held:
        obj.ref_count_down()


def test_a_window_ahead_of_the_first_allocation_becomes_resident():
    pool = HostPoolAllocator(256 * MB, prefault_ahead=32 * MB)
    try:
        assert pool.prefaulter is not None
        assert wait_until(lambda: pool.prefaulter.populated >= 32 * MB - 4096)
        assert _resident(pool.buffer) >= 24 * MB  # made resident, not merely counted
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
        assert wait_until(lambda: pool.prefaulter.populated >= 48 * MB)
        assert torch.equal(pool.buffer[40 * MB : 41 * MB], pattern)
        assert pool.prefaulter.populated <= 128 * MB
        _release(*held)
    finally:
        pool.close()


def test_the_window_never_passes_the_pool():
    pool = HostPoolAllocator(16 * MB, prefault_ahead=64 * MB)
    try:
        assert wait_until(lambda: pool.prefaulter.populated >= 16 * MB - 4096)
        assert pool.prefaulter.populated <= 16 * MB
        held = _allocate(pool, 16 * MB)
        assert held is not None
        _release(held)
    finally:
        pool.close()


def test_close_stops_the_thread():
    pool = HostPoolAllocator(64 * MB, prefault_ahead=8 * MB)
    pool.close()
    thread = pool.prefaulter._thread
    assert thread is not None
    assert wait_until(lambda: not thread.is_alive())


def test_no_prefault_when_disabled():
    pool = HostPoolAllocator(8 * MB, prefault_ahead=0)
    assert pool.prefaulter is None
    held = _allocate(pool, MB)
    assert held is not None
    _release(held)
    pool.close()


def _thp_built_in() -> bool:
    """The kernel has transparent huge pages (``MADV_HUGEPAGE`` is accepted,
    whatever the sysfs mode says about using them)."""
    return os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")


def _vma_flags(address: int) -> set[str]:
    """VmFlags of the mapping holding ``address`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as stream:
        for line in stream:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def _aligned_start(pool: HostPoolAllocator) -> int:
    huge = 2 * MB
    return -(-pool.buffer.data_ptr() // huge) * huge


def test_pool_asks_for_huge_pages_where_the_kernel_offers_them():
    pool = HostPoolAllocator(64 * MB, prefault_ahead=0, huge_pages=True)
    try:
        offered = _thp_built_in()
        assert pool.huge_pages is offered
        if offered:
            assert "hg" in _vma_flags(_aligned_start(pool))
        held = _allocate(pool, 4 * MB)
        held.tensor.fill_(7)
        assert int(held.tensor.sum()) == 7 * 4 * MB
        _release(held)
    finally:
        pool.close()


@pytest.mark.parametrize("setting", [None, False, True])
def test_huge_pages_follow_the_setting(setting, monkeypatch):
    from lmcache_ec.config import load_config
    from lmcache_ec.tiers import allocator
    from lmcache_ec.tiers.local_cpu import ECLocalCPUBackend

    # Off, the pool must not ask. Its buffer can come from heap memory an
    # earlier pool of this process advised (the kernel keeps the flag on the
    # range after free), so the mapping's flag proves only the asking.
    asked: list[int] = []
    advise = allocator.advise_huge_pages
    monkeypatch.setattr(allocator, "advise_huge_pages", lambda b: asked.append(1) or advise(b))
    values = {"max_local_cpu_size": 0.0625}
    if setting is not None:
        values["cpu_huge_pages"] = setting
    config = load_config(values, environ={})
    pool = ECLocalCPUBackend.initialize_allocator(None, config.to_lmcache())
    try:
        wanted = bool(setting) and _thp_built_in()  # off by default
        assert pool.huge_pages is wanted
        assert bool(asked) is bool(setting)
        if wanted:
            assert "hg" in _vma_flags(_aligned_start(pool))
    finally:
        pool.close()


def test_a_window_ending_inside_a_page_never_ends_the_prefault():
    """Allocations end anywhere, the window is kept to whole pages: a window
    ending inside a page left the thread's position unaligned, and its next
    madvise failed (EINVAL), ending the prefault for good."""
    pool = HostPoolAllocator(128 * MB, prefault_ahead=8 * MB)
    try:
        prefaulter = pool.prefaulter
        assert wait_until(lambda: prefaulter.populated >= 8 * MB - 4096)
        prefaulter.reached(3 * MB + 123)  # the window now ends inside a page
        assert wait_until(lambda: prefaulter.populated >= 11 * MB - 4096)
        prefaulter.reached(20 * MB + 7)
        assert wait_until(lambda: prefaulter.populated >= 28 * MB - 4096, timeout=10)
    finally:
        pool.close()
