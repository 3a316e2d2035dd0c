"""ReadPool: one batch's reads on several threads, results in order."""

from __future__ import annotations

import threading

import pytest
import torch

from lmcache_ec.config import ConfigError, load_config
from lmcache_ec.storage.read_pool import ReadPool
from tests.conftest import bit_equal, make_tensor


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ec-read")]


def test_a_batch_is_read_on_two_threads_at_once_and_returned_in_order():
    pool = ReadPool(2)
    both_reading = threading.Barrier(2, timeout=10)
    readers: dict[int, int] = {}

    def read(item: int) -> int:
        readers[item] = threading.get_ident()
        if item < 2:
            both_reading.wait()  # breaks (and fails the test) unless two reads overlap
        return item * 10

    try:
        assert pool.map(read, list(range(6))) == [0, 10, 20, 30, 40, 50]
        assert readers[0] != readers[1]
        assert threading.get_ident() in readers.values()  # the caller reads too
    finally:
        pool.close()


def test_one_thread_reads_everything_on_the_caller():
    pool = ReadPool(1)
    readers = set()
    assert pool.map(lambda item: readers.add(threading.get_ident()) or item, [1, 2, 3]) == [1, 2, 3]
    assert readers == {threading.get_ident()}


def test_the_first_failure_is_raised_after_every_thread_stopped():
    pool = ReadPool(2)
    running = threading.Event()
    ended: list[int] = []

    def read(item: int) -> int:
        if item == 0:
            running.wait(10)  # the other thread is inside item 1
            raise KeyError("boom")
        if item == 1:
            running.set()
        ended.append(item)
        return item

    try:
        with pytest.raises(KeyError, match="boom"):
            pool.map(read, [0, 1])
        assert ended == [1]  # the helper's read finished before map raised
        assert pool.map(lambda item: item + 1, [1, 2, 3]) == [2, 3, 4]  # still usable
    finally:
        pool.close()


def test_after_close_batches_are_read_on_the_caller_and_no_thread_is_left():
    before = set(_reader_threads())
    pool = ReadPool(3)
    both_reading = threading.Barrier(2, timeout=10)
    pool.map(lambda item: both_reading.wait(), [0, 1])
    assert set(_reader_threads()) > before
    pool.close()
    assert set(_reader_threads()) == before
    readers = set()
    assert pool.map(lambda item: readers.add(threading.get_ident()) or item, [4, 5]) == [4, 5]
    assert readers == {threading.get_ident()}


def test_a_batch_does_not_wait_for_helpers_busy_with_another_callers_batch():
    pool = ReadPool(2)  # one helper thread, shared by every caller
    release = threading.Event()
    both_started = threading.Barrier(3, timeout=10)

    def slow(item: int) -> int:
        both_started.wait()
        release.wait(10)
        return item

    first = threading.Thread(target=pool.map, args=(slow, [0, 1]))
    first.start()
    try:
        both_started.wait()  # the first batch holds the caller's thread and the helper
        done: list[list[int]] = []
        second = threading.Thread(target=lambda: done.append(pool.map(lambda i: i * 2, [1, 2, 3])))
        second.start()
        second.join(5)
        assert done == [[2, 4, 6]]  # read on its own caller's thread, not queued behind
    finally:
        release.set()
        first.join(10)
        pool.close()


def test_thread_counts_below_one_are_refused():
    with pytest.raises(ValueError, match="threads"):
        ReadPool(0)
    with pytest.raises(ConfigError, match="read_threads"):
        load_config({"read_threads": 0})
    assert load_config({"read_threads": "3"}).read_threads == 3


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_get_many_reads_cpu_and_disk_hits_and_misses_in_order(threads, make_cache):
    items = {f"img-{i}": make_tensor((64 + i, 128), torch.bfloat16, seed=i) for i in range(8)}
    with make_cache(read_threads=threads) as writer:
        assert all(writer.put_many(items))
        assert writer.flush(10)
    names = ["absent", *items, "img-3", "img-3"]
    before = set(_reader_threads())
    with make_cache(read_threads=threads) as cache:  # a new engine: every hit is on disk
        assert cache.get("img-0") is not None and cache.flush(10)  # img-0 promoted to the CPU tier
        got = cache.get_many(names)
        assert got[0] is None
        for name, out in zip(names[1:], got[1:], strict=True):
            assert bit_equal(out, items[name])
        assert len({id(out) for out in got[1:]}) == len(got) - 1  # private results
        hits = cache.stats.snapshot()["hits"]
        assert sum(hits.values()) == 1 + len(names) - 1  # the get, and every item but "absent"
        assert hits["cpu"] >= 1 and hits["disk"] >= len(items)
    assert set(_reader_threads()) == before  # close() stopped this engine's helpers


def test_a_batch_of_cpu_hits_is_copied_on_the_callers_thread(cache):
    items = {f"img-{i}": make_tensor((32, 64), torch.float16, seed=i) for i in range(4)}
    assert all(cache.put_many(items))
    before = set(_reader_threads())
    got = cache.get_many(list(items))
    assert all(bit_equal(out, tensor) for out, tensor in zip(got, items.values(), strict=True))
    assert cache.stats.snapshot()["hits"] == {"cpu": len(items)}
    assert set(_reader_threads()) == before  # no helper was started


def test_get_many_reads_node_tier_hits_on_two_threads(tmp_path, make_cache):
    config = {
        "local_cpu": True,  # the node tier takes its role: the pool only stages
        "max_local_cpu_size": 0.05,
        "local_disk": None,
        "node_tier": True,
        "node_dir": str(tmp_path),
        "max_node_size": 0.25,
        "namespace": "read-pool",
        "read_threads": 2,
    }
    items = {f"img-{i}": make_tensor((48, 96), torch.bfloat16, seed=i) for i in range(6)}
    writer = make_cache(config)
    assert all(writer.put_many(items))
    assert writer.flush(10)
    # Another process's view (while the writer uses the tier, its entries stay).
    with make_cache(config) as reader:
        got = reader.get_many([*items, "absent"])
        assert got[-1] is None
        assert all(bit_equal(out, t) for out, t in zip(got, items.values(), strict=False))
        assert reader.stats.snapshot()["hits"] == {"node": len(items)}
