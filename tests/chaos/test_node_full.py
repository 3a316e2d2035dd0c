"""A node tier on a full filesystem: puts say when they fail, eviction resumes.

The node tier lives in ``/dev/shm``, which other programs (vLLM's own shared
memory among them) fill too, and whose size is often far below
``max_node_size`` (Docker's default is 64 MB). Here it is a real 3 MiB tmpfs
(mounted as root, as CI runs; each test ~0.5 s).
"""

from __future__ import annotations

import os

import pytest
import torch

from lmcache_ec import ECCache
from tests.conftest import bit_equal, make_tensor
from tests.faults.fs import node_tier_on, tiny_tmpfs

SHAPE = (256, 768)  # bfloat16: 384 KiB payload, 97 pages on tmpfs
SIZE_MB = 3


@pytest.fixture
def tiny_shm():
    with tiny_tmpfs(SIZE_MB) as point:
        yield point


@pytest.fixture
def cache(tiny_shm, make_cache) -> ECCache:
    """A CPU + node tier whose node directory is the tiny tmpfs."""
    return make_cache(node_tier_on(tiny_shm), dtype=torch.bfloat16)


def _tensor(i: int) -> torch.Tensor:
    return make_tensor(SHAPE, torch.bfloat16, seed=i)


def _free(path: str) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _node(cache: ECCache):
    return cache._storage.storage_backends["NodeBackend"]


def test_puts_beyond_the_filesystem_evict_and_keep_writing(tiny_shm, cache):
    stored = [cache.put(f"img-{i}", _tensor(i)) for i in range(20)]
    assert all(stored)
    node = _node(cache).snapshot()
    assert node.get("write_errors", 0) == 0
    assert _free(tiny_shm) > 0  # something is always left to the filesystem's other users
    # The newest entries are there and exact; the oldest made room for them.
    assert all(bit_equal(cache.get(f"img-{i}"), _tensor(i)) for i in range(17, 20))
    assert cache.get("img-0") is None
    assert cache.stats.snapshot()["put_rejected"] == 0


def test_a_filesystem_filled_by_others_fails_puts_until_it_has_room(tiny_shm, cache):
    other = os.path.join(tiny_shm, "someone-elses-segment")
    with open(other, "wb") as stream:  # what vLLM's shared memory would take
        stream.write(b"\1" * (_free(tiny_shm) - 64 * 1024))
    assert not cache.put("img-0", _tensor(0))  # reported, not pretended
    assert cache.get("img-0") is None
    assert cache.stats.snapshot()["put_rejected"] == 1
    os.remove(other)
    assert cache.put("img-1", _tensor(1))  # room again: writing resumes
    assert bit_equal(cache.get("img-1"), _tensor(1))


def test_a_write_that_finds_the_filesystem_full_evicts_and_retries_once(tiny_shm, cache):
    assert all(cache.put(f"old-{i}", _tensor(i)) for i in range(3))
    node = _node(cache)
    layout = node.budget.layout
    create_temp = layout.create_temp
    other = os.path.join(tiny_shm, "filled-meanwhile")

    def fill_then_create(name, size, **how):
        # Once: someone takes the room the reservation saw free, before its
        # blocks are allocated (the allocation then finds the filesystem full).
        if not os.path.exists(other):
            with open(other, "wb") as stream:
                stream.write(b"\1" * (_free(tiny_shm) - 8192))
        return create_temp(name, size, **how)

    layout.create_temp = fill_then_create
    assert cache.put("new", _tensor(9))
    assert bit_equal(cache.get("new"), _tensor(9))
    counters = node.snapshot()
    assert counters["full_retries"] == 1
    assert counters.get("write_errors", 0) == 0
    assert cache.get("old-0") is None  # evicted for it
