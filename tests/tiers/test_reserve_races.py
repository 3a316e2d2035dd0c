"""A directory held to its filesystem's free space (the node tier in
``/dev/shm``) keeps that filesystem's reserve free however many writers
reserve at once (``budget.py``): each reservation's temp file is allocated
its size under the ledger's lock (and keeps it when opened for writing),
so the next writer's look at the free space, in any process, counts every
write still in progress. A filesystem
filled by others between that look and the allocation fails the allocation,
before anything is written: the write evicts and retries once.

On a real small tmpfs (mounted as root, as CI runs).
"""

from __future__ import annotations

import os

import pytest

from lmcache_ec.tiers.budget import DirectoryBudget, free_reserve, on_disk
from lmcache_ec.tiers.disk_layout import DirectoryLayout
from tests.faults.fs import tiny_tmpfs
from tests.tiers.budgets import entry_names

SIZE_MB = 4  # its reserve: 256 KiB
WRITE = 1536 * 1024  # two fit beside the reserve, four would fill it half again


@pytest.fixture
def tiny_shm():
    with tiny_tmpfs(SIZE_MB) as point:
        yield point


def _fs(path: str) -> tuple[int, int]:
    """(total, free) bytes of the filesystem of ``path``."""
    stat = os.statvfs(path)
    return stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize


def test_writers_reserving_at_once_leave_the_filesystems_reserve_free(tiny_shm):
    # One budget per writer, as in four processes: each locks its own description.
    writers = [
        DirectoryBudget(DirectoryLayout(tiny_shm), 1 << 30, 0.0, capped_by_free_space=True)
        for _ in range(4)
    ]
    # Every reservation made before any write: the moment N writers meet.
    granted = []
    for budget, name in zip(writers, entry_names(len(writers)), strict=True):
        temp = budget.reserve(name, WRITE)
        if temp is not None:
            granted.append((budget, name, temp))
    total, _ = _fs(tiny_shm)
    assert granted
    assert len(granted) * on_disk(WRITE) <= total - free_reserve(total)
    for budget, name, temp in granted:
        assert budget.layout.write(name, bytes(WRITE), temp=temp)
    assert _fs(tiny_shm)[1] >= free_reserve(total)  # vLLM's shared memory still has it


def test_a_reserved_temp_file_keeps_its_blocks_when_opened_for_writing(tiny_shm):
    """Truncating it at open would give them back to the filesystem, for the
    next writer to count as free while this write still needs them."""
    budget = DirectoryBudget(DirectoryLayout(tiny_shm), 1 << 30, 0.0, capped_by_free_space=True)
    temp = budget.reserve(entry_names(1)[0], WRITE)
    assert temp is not None
    with budget.layout.open_temp(temp):
        assert os.stat(temp).st_blocks * 512 >= WRITE
