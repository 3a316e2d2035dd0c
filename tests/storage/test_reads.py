"""The read path: private results, disk reads, and promotion of disk hits."""

from __future__ import annotations

import threading

import torch

from lmcache_ec import ECCache
from lmcache_ec.storage.promotion import Promoter
from tests.conftest import bit_equal, make_tensor

SHAPE = (64, 512)  # float32: 128 KB frames


def _small_cpu_config(disk_dir, frames: float) -> dict:
    frame = SHAPE[0] * SHAPE[1] * 4 + 4096
    return {
        "local_cpu": True,
        "max_local_cpu_size": frame * frames / 1024**3,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 1.0,
    }


def _write_to_disk(writer: ECCache, entries: dict[str, torch.Tensor]) -> None:
    """Store ``entries`` with ``writer``, then close it: the entries are on disk only."""
    with writer:
        assert all(writer.put_many(entries))
        assert writer.flush(10)


def test_results_are_private_on_every_tier(make_cache):
    tensor = make_tensor(SHAPE, torch.float32, seed=1)
    _write_to_disk(make_cache(), {"x": tensor})
    cache = make_cache()
    from_disk = cache.get("x")
    assert cache.stats.snapshot()["hits"] == {"disk": 1}
    from_disk.fill_(7.0)  # the caller owns what it got
    from_cpu = cache.get("x")
    assert cache.stats.snapshot()["hits"] == {"disk": 1, "cpu": 1}
    assert bit_equal(from_cpu, tensor)
    from_cpu.fill_(9.0)
    assert bit_equal(cache.get("x"), tensor)


def test_disk_hit_is_promoted_once_reads_pause(make_cache):
    tensors = {f"k{i}": make_tensor(SHAPE, torch.float16, seed=i) for i in range(4)}
    _write_to_disk(make_cache(), tensors)
    cache = make_cache()
    for name, tensor in tensors.items():
        assert bit_equal(cache.get(name), tensor)
    assert cache.flush(10)  # promotions count as pending writes
    assert [cache.contains(name) for name in tensors] == ["cpu"] * 4
    assert all(bit_equal(cache.get(n), t) for n, t in tensors.items())
    assert cache.stats.snapshot()["hits"] == {"disk": 4, "cpu": 4}


def test_remove_right_after_a_disk_hit_is_not_undone(make_cache):
    tensor = make_tensor(SHAPE, torch.float32, seed=2)
    _write_to_disk(make_cache(), {"gone": tensor})
    cache = make_cache()
    assert bit_equal(cache.get("gone"), tensor)  # queues a promotion
    assert cache.remove("gone")
    assert cache.flush(10)
    assert cache.contains("gone") is None
    assert cache.get("gone") is None


def test_late_promotion_never_evicts_newer_entries(disk_dir, make_cache):
    config = _small_cpu_config(disk_dir, frames=3.5)
    old = {f"old-{i}": make_tensor(SHAPE, torch.float32, seed=i) for i in range(2)}
    _write_to_disk(make_cache(config), old)
    new = {f"new-{i}": make_tensor(SHAPE, torch.float32, seed=10 + i) for i in range(3)}
    cache = make_cache(config)
    for name, tensor in old.items():  # disk hits: promotions queued
        assert bit_equal(cache.get(name), tensor)
    for name, tensor in new.items():  # fill the CPU tier after those reads
        assert cache.put(name, tensor)
    assert cache.flush(10)
    assert [cache.contains(name) for name in new] == ["cpu"] * 3
    assert all(cache.contains(name) == "disk" for name in old)


def test_a_promotion_that_lands_after_newer_puts_ranks_behind_them(disk_dir, make_cache):
    """Old entries read from disk before new puts are promoted after them (here at
    once, by ``contains``): they take their place as of their read, so the next
    puts evict them, not the newer entries."""
    config = _small_cpu_config(disk_dir, frames=3.5)
    old = {f"old-{i}": make_tensor(SHAPE, torch.float32, seed=i) for i in range(2)}
    _write_to_disk(make_cache(config), old)
    new = {f"new-{i}": make_tensor(SHAPE, torch.float32, seed=10 + i) for i in range(3)}
    cache = make_cache(config)
    promoter = cache._reader._promoter
    promoter._idle = promoter._max_wait = 3600.0  # its thread waits: only settle promotes
    for name, tensor in old.items():  # disk hits: promotions queued
        assert bit_equal(cache.get(name), tensor)
    assert cache.put("new-0", new["new-0"])
    # The promotions land now, after new-0 (contains finishes a pending one).
    assert [cache.contains(name) for name in old] == ["cpu", "cpu"]
    # new-0's disk write done: a write in flight pins its CPU buffer, which
    # would keep it from eviction whatever its place in the use order.
    assert cache.flush(10)
    for name in ("new-1", "new-2"):
        assert cache.put(name, new[name])
    assert cache.flush(10)
    assert [cache.contains(name) for name in new] == ["cpu"] * 3
    assert [cache.contains(name) for name in old] == ["disk", "disk"]


def test_truncated_disk_entry_is_a_counted_miss_and_removed(disk_dir, make_cache):
    tensor = make_tensor(SHAPE, torch.bfloat16, seed=3)
    _write_to_disk(make_cache(), {"cut": tensor})
    (path,) = disk_dir.glob("*.pt")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    cache = make_cache()
    assert cache.get("cut") is None
    assert cache.stats.snapshot()["integrity_failures"] == 1
    assert not path.exists()


def test_promoter_settle_runs_a_queued_promotion_in_the_caller():
    done: list[tuple[str, int, str]] = []
    promoter = Promoter(
        lambda key, level: done.append((key, level, threading.current_thread().name)),
        idle=60.0,
        max_wait=60.0,
    )
    try:
        promoter.reading()  # a read just started: the thread holds back
        assert promoter.submit("a", 1) and promoter.submit("b", 1)
        assert not promoter.submit("a", 1)  # one promotion per key at a time
        assert promoter.pending() == 2
        promoter.settle("a")
        assert done == [("a", 1, threading.current_thread().name)]
        promoter.cancel("b")
        assert promoter.pending() == 0
    finally:
        promoter.close()
    assert not promoter.submit("c", 1)  # closed: skipped
    assert done == [("a", 1, threading.current_thread().name)]


def test_promoter_thread_runs_once_reads_pause():
    ran = threading.Event()
    promoter = Promoter(lambda key: ran.set(), idle=0.01, max_wait=60.0)
    try:
        assert promoter.submit("k")
        assert ran.wait(10)
        promoter.settle("k")
        assert promoter.pending() == 0
    finally:
        promoter.close()
