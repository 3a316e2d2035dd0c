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
import torch

from lmcache_ec.key import EncoderIdentity
from lmcache_ec.tiers.budget import DirectoryBudget, free_reserve, on_disk
from lmcache_ec.tiers.disk_layout import DirectoryLayout
from tests.conftest import bit_equal, make_tensor
from tests.faults.fs import node_tier_on, tiny_tmpfs

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


def _names(count: int) -> list[str]:
    identity = EncoderIdentity(model="m", dtype="float16")
    return [identity.key(f"e{i}").storage_name for i in range(count)]


def test_writers_reserving_at_once_leave_the_filesystems_reserve_free(tiny_shm):
    # One budget per writer, as in four processes: each locks its own description.
    writers = [
        DirectoryBudget(DirectoryLayout(tiny_shm), 1 << 30, 0.0, capped_by_free_space=True)
        for _ in range(4)
    ]
    # Every reservation made before any write: the moment N writers meet.
    granted = []
    for budget, name in zip(writers, _names(len(writers)), strict=True):
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
    temp = budget.reserve(_names(1)[0], WRITE)
    assert temp is not None
    with budget.layout.open_temp(temp):
        assert os.stat(temp).st_blocks * 512 >= WRITE


@pytest.fixture
def cache(tiny_shm, make_cache):
    """A CPU + node tier whose node directory is the tiny tmpfs."""
    return make_cache(node_tier_on(tiny_shm), dtype=torch.bfloat16)


def _tensor(i: int) -> torch.Tensor:
    return make_tensor((256, 768), torch.bfloat16, seed=i)  # 384 KiB


def test_a_filesystem_filled_between_the_look_and_the_allocation_evicts_and_retries_once(
    tiny_shm, cache
):
    assert all(cache.put(f"old-{i}", _tensor(i)) for i in range(3))
    node = cache._storage.node
    create_temp = node.layout.create_temp
    other = os.path.join(tiny_shm, "filled-meanwhile")

    def fill_then_create(name: str, size: int, **how) -> str:
        if not os.path.exists(other):  # once: someone takes the room just seen free
            with open(other, "wb") as stream:
                stream.write(b"\1" * (_fs(tiny_shm)[1] - 8192))
        return create_temp(name, size, **how)

    node.layout.create_temp = fill_then_create
    assert cache.put("new", _tensor(9))
    assert bit_equal(cache.get("new"), _tensor(9))
    counters = node.snapshot()
    assert counters["full_retries"] == 1
    assert counters.get("write_errors", 0) == 0
    assert cache.get("old-0") is None  # evicted for it
