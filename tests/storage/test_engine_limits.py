"""Limits the engine keeps over time and across threads.

- Puts and promotions leave LMCache's KV-chunk statistics (a process-wide
  monitor, and the CPU tier's policy) as they were: nothing grows per put.
- A put that evicts to make room logs nothing; LMCache's own pools still warn.
- The CPU pool is a whole number of allocation units: a frame larger than
  ``cpu_capacity`` raises ``ValueError``, one not larger is stored, and
  neither empties the tier.
- ``remove`` is not undone by a read that fetched the entry before it.
- ``get_or_compute`` checks ``compute``'s results against the identity the
  call started with, not one ``set_identity`` set meanwhile.
- A storage name is one line: a trailing newline makes it none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import pytest
import torch
from lmcache.observability import LMCStatsMonitor
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
from lmcache.v1.memory_management import MemoryFormat

from lmcache_ec import codec
from lmcache_ec.config_schema import gb_to_bytes
from lmcache_ec.key import ECKey
from tests.conftest import bit_equal, make_tensor

SHAPE = (64, 256)  # float32: 64 KB frames
FRAME = SHAPE[0] * SHAPE[1] * 4 + 4096  # a frame, rounded up to the allocation unit


def _tiny_cpu(disk_dir, frames: int) -> dict:
    """A CPU tier of ``frames`` frames over a disk tier that holds them all."""
    return {
        "local_cpu": True,
        "max_local_cpu_size": frames * FRAME / 1024**3,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 0.1,
    }


@contextlib.contextmanager
def _records(name: str):
    """The records logged on logger ``name`` (filters applied) while inside."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


# -- LMCache's KV-chunk statistics ---------------------------------------------


def test_puts_and_promotions_leave_lmcaches_chunk_statistics_flat(disk_dir, make_cache):
    cache = make_cache(_tiny_cpu(disk_dir, 4), dtype="float32")
    monitor = LMCStatsMonitor.GetOrCreate()
    policy = cache._cpu.cache_policy
    names = [f"k{i}" for i in range(12)]  # three times what the CPU tier holds
    lifespans = len(monitor.interval_request_cache_lifespan)
    tensor = make_tensor(SHAPE, torch.float32)
    for name in names:
        assert cache.put(name, tensor)
        assert cache.flush(10)  # an entry is evictable once on the disk
    for _ in range(3):  # every read a disk hit, promoted: a put into the CPU tier
        for name in names:
            assert cache.get(name) is not None
            cache.promote_now()
    assert cache.stats.snapshot()["hits"].get("disk", 0) >= 2 * len(names)
    assert len(monitor.interval_request_cache_lifespan) == lifespans
    assert len(getattr(policy, "chunk_hash_to_init_timestamp", {})) == 0


def test_the_cpu_tier_still_evicts_its_least_recently_used_entry(disk_dir, make_cache):
    cache = make_cache(_tiny_cpu(disk_dir, 3), dtype="float32")
    tensor = make_tensor(SHAPE, torch.float32)
    for name in ("a", "b", "c"):
        assert cache.put(name, tensor)
        assert cache.flush(10)  # an entry is evictable once on the disk
    assert cache.get("a") is not None  # "b" is now the least recently used
    assert cache.put("d", tensor)
    assert [cache.contains(name) for name in "abcd"] == ["cpu", "disk", "cpu", "cpu"]


# -- a full pool ------------------------------------------------------------------


def test_puts_that_evict_to_make_room_log_no_allocation_failure(make_cache):
    cache = make_cache({"local_cpu": True, "max_local_cpu_size": 4 * FRAME / 1024**3})
    tensor = make_tensor(SHAPE, torch.float32)
    with _records("lmcache.v1.memory_management") as records:
        assert all(cache.put(f"k{i}", tensor) for i in range(20))
    assert cache.stats.snapshot()["put_rejected"] == 0
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []


def test_lmcaches_own_pools_still_warn_when_full():
    pool = TensorMemoryAllocator(torch.empty(4096, dtype=torch.uint8))
    with _records("lmcache.v1.memory_management") as records:
        assert pool.allocate(torch.Size([8192]), torch.uint8, MemoryFormat.EC_TD) is None
    assert any("no memory is available" in r.getMessage() for r in records)


# -- the CPU pool's size --------------------------------------------------------------


def _frame_of(cache, name: str, size: int) -> torch.Tensor:
    """A float32 tensor whose frame under ``name`` is the largest not above ``size`` bytes."""
    key = cache.key(name)
    overhead = codec.frame_size(codec.encode_header(key, torch.zeros(1, 1)), torch.zeros(1, 0))
    tensor = torch.ones(1, (size - overhead) // 4)
    while codec.frame_size(codec.encode_header(key, tensor), tensor) > size:
        tensor = tensor[:, :-1]
    return tensor


def test_a_frame_larger_than_the_pool_once_rounded_is_refused_and_evicts_nothing(make_cache):
    asked = gb_to_bytes(0.004)  # 4294967 bytes: not a whole number of 4 KiB units
    cache = make_cache({"local_cpu": True, "max_local_cpu_size": 0.004}, dtype="float32")
    assert asked - 4096 < cache.cpu_capacity <= asked
    assert cache.cpu_capacity % 4096 == 0
    small = make_tensor((16, 64), torch.float32)
    for i in range(8):
        assert cache.put(f"s{i}", small)
    big = _frame_of(cache, "big", asked)
    with pytest.raises(ValueError, match="exceeds the CPU tier"):
        cache.put("big", big)
    assert all(bit_equal(cache.get(f"s{i}"), small) for i in range(8))


def test_a_frame_of_the_whole_pool_is_stored(make_cache):
    cache = make_cache({"local_cpu": True, "max_local_cpu_size": 0.004}, dtype="float32")
    whole = _frame_of(cache, "whole", cache.cpu_capacity)
    assert cache.put("whole", whole)
    assert bit_equal(cache.get("whole"), whole)


# -- remove ------------------------------------------------------------------------------


def test_remove_during_a_remote_read_is_not_undone_by_its_promotion(
    disk_dir, redis_url, make_cache
):
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.0625,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 0.1,
        "remote_url": redis_url,
    }
    cache = make_cache(config, dtype="float32")
    tensor = make_tensor(SHAPE, torch.float32)
    assert cache.put("x", tensor)
    assert cache.flush(10)
    key = cache.key("x")
    tiers = cache._storage.tiers()
    for tier in tiers:
        if tier.kind.local:
            tier.remove(key)  # only the remote tier holds it now
    remote = next(tier for tier in tiers if not tier.kind.local)
    fetch = remote.read
    removed = []

    def read(key):  # the frame fetched, then removed before the read returns
        data = fetch(key)
        removed.append(cache.remove("x"))
        return data

    remote.read = read
    try:
        assert bit_equal(cache.get("x"), tensor)  # served: it was read before the removal
    finally:
        remote.read = fetch
    assert removed == [True]
    assert cache.flush(10)
    assert cache.contains("x") is None  # neither in the CPU tier nor on the disk
    assert cache.get("x") is None


# -- get_or_compute across set_identity --------------------------------------------------


def _switching_to_bfloat16(cache, result: torch.Tensor):
    """A ``compute`` that sets a bfloat16 identity (new weights) and returns ``result``."""
    new = dataclasses.replace(cache.identity, dtype="bfloat16", weights="v2")

    def compute() -> torch.Tensor:
        cache.set_identity(new)
        return result

    return compute


def test_a_result_of_the_calls_dtype_is_returned_across_set_identity(make_cache):
    cache = make_cache(dtype="float32")
    result = torch.ones(4, 8)
    got = cache.get_or_compute("img", _switching_to_bfloat16(cache, result))
    assert got.dtype == torch.float32 and bit_equal(got, result)
    counts = cache.stats.snapshot()["get_or_compute"]
    assert (counts["rejected"], counts["not_stored"]) == (0, 1)


def test_a_result_of_the_new_identitys_dtype_is_refused_for_a_call_begun_before(make_cache):
    cache = make_cache(dtype="float32")
    compute = _switching_to_bfloat16(cache, torch.ones(4, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bfloat16"):
        cache.get_or_compute("img", compute)
    assert cache.stats.snapshot()["get_or_compute"]["rejected"] == 1


# -- storage names ------------------------------------------------------------------------


def test_a_storage_name_with_a_trailing_newline_is_none():
    name = "ec1.ns.m." + "0" * 64
    assert ECKey.is_storage_name(name)
    assert not ECKey.is_storage_name(name + "\n")
    with pytest.raises(ValueError, match="not an lmcache-ec storage name"):
        ECKey.from_storage_name(name + "\n")
