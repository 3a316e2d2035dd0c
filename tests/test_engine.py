"""ECCache over LMCache's CPU and disk tiers: round trips, LRU, bad input."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from lmcache_ec import ECCache
from lmcache_ec.key import EncoderIdentity
from lmcache_ec.tiers.budget import DirectoryBudget
from lmcache_ec.tiers.disk_layout import DirectoryLayout
from tests.conftest import bit_equal, make_tensor
from tests.copies import COPIES, CopyCounter

SHAPES = [(256, 2560), (512, 5376), (1024, 2048)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_through_cpu_tier(cache, shape, dtype):
    tensor = make_tensor(shape, dtype, seed=hash(shape) % 1000)
    assert cache.put("img", tensor) is True
    assert cache.contains("img") == "cpu"
    out = cache.get("img")
    assert out is not None and bit_equal(out, tensor)
    assert out.data_ptr() != tensor.data_ptr()
    assert cache.stats.snapshot()["hits"] == {"cpu": 1}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_through_disk_tier(shape, dtype, make_cache):
    tensor = make_tensor(shape, dtype, seed=1)
    with make_cache() as writer:
        assert writer.put("img", tensor)
    reader = make_cache()
    assert reader.contains("img") == "disk"
    out = reader.get("img")
    assert out is not None and bit_equal(out, tensor)
    assert reader.stats.snapshot()["hits"] == {"disk": 1}
    # The verified disk hit was promoted: the next read is a CPU hit.
    assert reader.contains("img") == "cpu"
    assert bit_equal(reader.get("img"), tensor)


def test_disk_only_tier_without_cpu_hot_cache(disk_dir, make_cache):
    config = {"local_cpu": False, "max_local_cpu_size": 0.05, "local_disk": str(disk_dir)}
    tensor = make_tensor((64, 32), torch.float16)
    cache = make_cache(config)
    assert cache.tiers == ["disk"]
    assert cache.put("a", tensor)
    assert cache.flush()
    assert cache.contains("a") == "disk"
    assert bit_equal(cache.get("a"), tensor)
    assert cache.contains("a") == "disk"  # no CPU copy kept


def test_non_contiguous_and_other_device_inputs(cache):
    tensor = make_tensor((128, 64), torch.float32).t()
    assert cache.put("t", tensor)
    assert bit_equal(cache.get("t"), tensor.contiguous())


def lru_cache_config(frame_bytes: int, frames: float) -> dict:
    return {"local_cpu": True, "max_local_cpu_size": frame_bytes * frames / 1024**3}


def test_cpu_tier_evicts_least_recently_used(make_cache):
    tensors = {
        name: make_tensor((256, 1024), torch.float32, seed=i) for i, name in enumerate("abcd")
    }
    frame = 256 * 1024 * 4 + 4096
    cache = make_cache(lru_cache_config(frame, 3.5))
    for name in "abc":
        assert cache.put(name, tensors[name])
    assert cache.get("a") is not None  # a is now the most recently used
    assert cache.put("d", tensors["d"])
    assert cache.contains("b") is None  # the least recently used went
    for name in "acd":
        assert bit_equal(cache.get(name), tensors[name])


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ([[1.0]], TypeError, "torch.Tensor"),
        (None, TypeError, "torch.Tensor"),
        (torch.zeros(8), ValueError, "2-D"),
        (torch.zeros(2, 3, 4), ValueError, "2-D"),
        (torch.zeros(0, 16), ValueError, "non-empty"),
        (torch.zeros(4, 4, dtype=torch.int32), ValueError, "unsupported encoder dtype"),
        (torch.zeros(4, 4, dtype=torch.float64), ValueError, "unsupported encoder dtype"),
        (torch.zeros(4, 4, device="meta"), ValueError, "meta"),
        (torch.eye(4).to_sparse(), ValueError, "dense"),
        (torch.nested.nested_tensor([torch.zeros(3), torch.zeros(5)]), ValueError, "nested"),
        (torch._efficientzerotensor(4, 4), ValueError, "ZeroTensor"),
    ],
)
def test_bad_tensors_raise_clear_errors_and_store_nothing(cache, value, error, message):
    with pytest.raises(error, match=message):
        cache.put("x", value)
    assert cache.contains("x") is None
    assert cache.stats.snapshot()["puts"] == 0


def test_a_cache_built_under_another_default_device_keeps_its_pool_on_the_host(make_cache):
    # A library caller may build it inside ``with torch.device("cuda"):`` (meta
    # here, for want of a GPU): the pool made there could take no host bytes.
    with torch.device("meta"):
        cache = make_cache()
    tensor = make_tensor((16, 64), torch.float32, seed=3)
    assert cache.put("x", tensor)
    assert bit_equal(cache.get("x"), tensor)


@pytest.mark.parametrize(
    ("device", "message"),
    [("meta", "holds no data"), ("mps", "not usable here"), ("gpu", "not a torch device")]
    + ([] if torch.cuda.is_available() else [("cuda", "not usable here")]),
)
def test_a_device_the_process_cannot_use_is_refused_before_any_read_or_compute(
    cache, device, message
):
    tensor = make_tensor((8, 16), torch.float32)
    assert cache.put("stored", tensor)
    computed = []
    for call in (
        lambda: cache.get("stored", device=device),
        lambda: cache.get_many(["stored"], device=device),
        lambda: cache.get_or_compute("new", lambda: computed.append(1) or tensor, device=device),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    assert computed == [] and cache.contains("new") is None
    assert cache.stats.snapshot()["hits"] == {}


def test_pinned_dtype_rejects_other_dtypes(make_cache):
    cache = make_cache(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="differs from the encoder dtype"):
        cache.put("x", torch.zeros(4, 4))
    assert cache.put("x", torch.zeros(4, 4, dtype=torch.bfloat16))


def test_bad_mm_hash_types(cache):
    with pytest.raises(TypeError):
        cache.put(b"bytes", torch.zeros(2, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.get(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cache.contains("")


def test_identities_never_exchange_entries(make_cache):
    tensor = make_tensor((8, 8), torch.float32)
    with make_cache(model="model-a") as cache:
        assert cache.put("same-image", tensor)
    for other in (
        {"model": "model-b"},
        {"model": "model-a", "revision": "v2"},
        {"model": "model-a", "namespace": "tenant-2"},
        {"model": "model-a", "fingerprint": "other-vision-config"},
    ):
        with make_cache(**other) as cache:
            assert cache.contains("same-image") is None
            assert cache.get("same-image") is None
    cache = make_cache(model="model-a")
    assert bit_equal(cache.get("same-image"), tensor)


def test_tenants_with_colliding_slugs_never_exchange_entries(make_cache):
    # Equal namespace slugs, hence equal storage-name prefixes: only the digest
    # keeps the two tenants apart on the shared disk directory.
    first, second = "t" * 32 + "15057", "t" * 32 + "25505"
    tensors = {first: make_tensor((8, 8), torch.float32, seed=1)}
    tensors[second] = make_tensor((8, 8), torch.float32, seed=2)
    with make_cache(namespace=first) as cache:
        assert cache.put("img", tensors[first])
        assert cache.flush()
        prefix = cache.key("img").identity.storage_prefix
    with make_cache(namespace=second) as cache:
        assert cache.key("img").identity.storage_prefix == prefix  # the slugs collide
        assert cache.contains("img") is None  # misses what the other tenant stored
        assert cache.get("img") is None
        assert cache.put("img", tensors[second])
        assert cache.flush()
    for namespace, tensor in tensors.items():
        with make_cache(namespace=namespace) as cache:
            assert bit_equal(cache.get("img"), tensor)


def test_a_key_made_across_set_identity_is_not_kept_for_the_new_identity(cache, monkeypatch):
    """A reader keying an item under the old identity while ``set_identity`` swaps
    in the new one: that key is never remembered for the new identity."""
    old = cache.identity
    assert cache.put("image", make_tensor((4, 8), torch.float32, 0))
    cache.set_identity(old)  # an empty key memo: the reader's get computes its key
    keying, resume = threading.Event(), threading.Event()
    real_key = EncoderIdentity.key

    def slow_key(identity: EncoderIdentity, mm_hash: str):
        key = real_key(identity, mm_hash)
        if identity is old and threading.current_thread().name == "reader":
            keying.set()
            resume.wait(10)
        return key

    monkeypatch.setattr(EncoderIdentity, "key", slow_key)
    reader = threading.Thread(target=cache.get, args=("image",), name="reader")
    reader.start()
    assert keying.wait(10)
    cache.set_identity(dataclasses.replace(old, weights="new-weights"))
    resume.set()
    reader.join(10)
    assert cache.key("image").identity.weights == "new-weights"
    assert cache.get("image") is None  # the old weights' entry is not found


def test_put_many_and_get_many(cache):
    items = {f"img-{i}": make_tensor((16 + i, 32), torch.bfloat16, seed=i) for i in range(5)}
    assert cache.put_many(items) == [True] * 5
    got = cache.get_many([*items, "missing"])
    assert got[-1] is None
    assert len(got) == len(items) + 1
    for out, tensor in zip(got[:-1], items.values(), strict=True):
        assert bit_equal(out, tensor)


def test_put_many_validates_everything_first(cache):
    with pytest.raises(ValueError):
        cache.put_many([("ok", torch.zeros(2, 2)), ("bad", torch.zeros(2))])
    assert cache.contains("ok") is None


def test_repeated_put_is_not_rewritten(cache):
    tensor = make_tensor((8, 8), torch.float32)
    assert cache.put("a", tensor) and cache.put("a", tensor)
    assert cache.stats.snapshot()["put_skipped_existing"] == 1


def test_remove(cache):
    cache.put("a", torch.ones(2, 2))
    assert cache.flush()
    assert cache.remove("a") is True
    assert cache.contains("a") is None and cache.get("a") is None
    assert cache.remove("a") is False


def test_close_flushes_every_accepted_write(make_cache):
    tensors = {f"img-{i}": make_tensor((256, 256), torch.float16, seed=i) for i in range(40)}
    cache = make_cache()
    assert all(cache.put_many(tensors))
    cache.close()
    cache.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        cache.get("img-0")
    reader = make_cache()
    for name, tensor in tensors.items():
        assert reader.contains(name) == "disk"
        assert bit_equal(reader.get(name), tensor)


def test_close_is_bounded_by_close_timeout_when_writes_and_the_stop_both_wait(disk_dir, make_cache):
    """Disk writes stuck behind a ledger another process holds: the flush and
    the tiers' stop share one ``close_timeout`` (each waited its own in turn)."""
    cache = make_cache(close_timeout=0.5)
    ledger = DirectoryBudget(DirectoryLayout(str(disk_dir)), 1, 0)._ledger_path()
    holder = os.open(ledger, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        for i in range(4):
            assert cache.put(f"held-{i}", make_tensor((64, 64), torch.float16, seed=i))
        started = time.monotonic()
        cache.close()
        took = time.monotonic() - started
    finally:
        os.close(holder)
    assert took < 0.5 + 0.5, f"close() took {took:.2f} s with close_timeout 0.5 s"


def _fill_pool(cache: ECCache) -> list:
    """Every buffer of the CPU pool, held: no put finds room until they go back."""
    held = []
    for size in (1 << 20, 1 << 14, 1 << 10, 1 << 8):
        while (buffer := cache._cpu.allocate_frame(size)) is not None:
            held.append(buffer)
    return held


def test_a_full_cpu_pool_is_logged_once_per_episode_and_counted_per_put(cpu_cache, caplog):
    tensor = make_tensor((16, 64), torch.float16)

    def pool_full_lines() -> int:
        return sum("CPU pool full" in r.getMessage() for r in caplog.records)

    held = _fill_pool(cpu_cache)
    assert [cpu_cache.put(f"refused-{i}", tensor) for i in range(5)] == [False] * 5
    assert cpu_cache.stats.snapshot()["put_rejected"] == 5
    assert pool_full_lines() == 1
    for buffer in held:
        buffer.ref_count_down()
    assert cpu_cache.put("stored", tensor)  # the episode ends
    held = _fill_pool(cpu_cache)
    assert cpu_cache.put("refused-again", tensor) is False
    assert cpu_cache.stats.snapshot()["put_rejected"] == 6
    assert pool_full_lines() == 2  # a new episode, a new line
    for buffer in held:
        buffer.ref_count_down()


def test_concurrent_callers(cache):
    errors: list[BaseException] = []

    def worker(thread: int) -> None:
        try:
            for i in range(25):
                name = f"t{thread}-{i % 7}"
                tensor = make_tensor((32, 16), torch.float32, seed=thread * 100 + i % 7)
                cache.put(name, tensor)
                out = cache.get(name)
                assert out is not None and bit_equal(out, tensor)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


def _rss_bytes() -> int:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * 4096


def test_cpu_pool_is_not_touched_at_start(make_cache):
    before = _rss_bytes()
    cache = make_cache({"max_local_cpu_size": 4.0})
    grown = _rss_bytes() - before
    assert cache.cpu_capacity == 4 * 1024**3
    assert grown < 256 * 1024**2, f"RSS grew {grown / 1e6:.0f} MB at construction"


def test_a_cpu_pool_larger_than_the_host_grants_is_a_smaller_pool_not_a_failed_start(
    make_cache, caplog
):
    asked = 2**47  # 128 TiB: more address space than a process has, whatever the overcommit
    cache = make_cache({"max_local_cpu_size": asked / 1024**3, "local_disk": None})
    assert 0 < cache.cpu_capacity < asked
    tensor = make_tensor((16, 64), torch.bfloat16)
    assert cache.put("big-pool", tensor) and bit_equal(cache.get("big-pool"), tensor)
    warnings = [r.getMessage() for r in caplog.records if "max_local_cpu_size" in r.getMessage()]
    # In the config's GB (1024**3 bytes), as the user wrote max_local_cpu_size.
    assert len(warnings) == 1
    assert f"asks for {asked / 1024**3:.1f} GB" in warnings[0]
    assert f"uses {cache.cpu_capacity / 1024**3:.1f} GB" in warnings[0]


def test_a_batch_holding_a_transposed_row_is_stored_whole(cache):
    column = make_tensor((1, 64), torch.bfloat16, seed=3).t()  # [64, 1], last stride 64
    first = make_tensor((8, 64), torch.bfloat16, seed=4)
    assert cache.put_many({"first": first, "column": column}) == [True, True]
    assert bit_equal(cache.get("column"), column) and bit_equal(cache.get("first"), first)


def test_with_no_tier_holding_entries_a_put_says_it_stored_nothing(make_cache, caplog):
    cache = make_cache({"local_cpu": False, "local_disk": None})
    assert cache.tiers == []
    assert cache.put("nowhere", make_tensor((4, 8), torch.bfloat16)) is False
    assert cache.stats.snapshot()["put_rejected"] == 1
    assert any("No tier holds entries" in r.getMessage() for r in caplog.records)


SMALL_CPU = {"local_cpu": True, "max_local_cpu_size": 0.02}


@pytest.fixture
def cpu_cache(make_cache):
    """A cache with a small CPU tier only."""
    with make_cache(SMALL_CPU, model="org/cpu") as cache:
        yield cache


def _cpu_entry(cache: ECCache, seed: int) -> tuple[torch.Tensor, object]:
    """A tensor put under "img", and the CPU-pool buffer holding it."""
    tensor = make_tensor((16, 64), torch.float16, seed=seed)
    assert cache.put("img", tensor)
    return tensor, cache._cpu.hot_cache[cache.key("img")]


def _in_pool(cache: ECCache, tensor: torch.Tensor) -> bool:
    pool = cache._cpu.memory_allocator.buffer
    return pool.data_ptr() <= tensor.data_ptr() < pool.data_ptr() + pool.numel()


def test_borrow_is_a_view_of_the_pool_held_inside_the_block(cpu_cache):
    tensor, memory_obj = _cpu_entry(cpu_cache, seed=7)
    held = memory_obj.get_ref_count()
    with CopyCounter() as counter, cpu_cache.borrow("img") as view:
        assert view is not None and torch.equal(view, tensor)
        assert _in_pool(cpu_cache, view)  # no copy: the pool itself
        assert memory_obj.get_ref_count() == held + 1  # not evicted or reused meanwhile
    assert counter.copies == []
    assert memory_obj.get_ref_count() == held
    with cpu_cache.borrow("absent") as missing:
        assert missing is None
    snapshot = cpu_cache.stats.snapshot()
    assert snapshot["hits"] == {"cpu": 1} and snapshot["misses"] == 1


class _DuringCopy(CopyCounter):
    """Copies counted, and ``probe()`` called while each one runs."""

    def __init__(self, probe) -> None:
        super().__init__()
        self.probe = probe
        self.seen: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in COPIES:
            self.seen.append(self.probe())
        return super().__torch_dispatch__(func, types, args, kwargs)


def test_cpu_get_is_one_copy_of_a_held_buffer_counted_as_a_read(cpu_cache):
    tensor, memory_obj = _cpu_entry(cpu_cache, seed=9)
    held = memory_obj.get_ref_count()
    reads = cpu_cache._reader._promoter.reads_in_progress
    with _DuringCopy(lambda: (memory_obj.get_ref_count(), reads())) as copies:
        out = cpu_cache.get("img")
    assert copies.copies == ["aten.clone.default"]
    # During the copy the buffer is held (never evicted or reused) and
    # background promotions see a read in progress.
    assert copies.seen == [(held + 1, 1)]
    assert memory_obj.get_ref_count() == held and reads() == 0
    assert not _in_pool(cpu_cache, out)  # private memory
    assert bit_equal(out, tensor)
    out.fill_(0)  # the caller's own: the entry is unchanged
    assert bit_equal(cpu_cache.get("img"), tensor)
    assert cpu_cache.stats.snapshot()["hits"] == {"cpu": 2}


def test_borrow_releases_the_pool_buffer_when_the_block_raises(cpu_cache):
    _, memory_obj = _cpu_entry(cpu_cache, seed=8)
    held = memory_obj.get_ref_count()
    with pytest.raises(KeyError), cpu_cache.borrow("img"):
        raise KeyError("consumer failed")
    assert memory_obj.get_ref_count() == held


def test_borrow_from_disk_is_the_tensor_read_for_the_call(tmp_path, make_cache):
    config = {
        "local_cpu": False,
        "max_local_cpu_size": 0.02,
        "local_disk": str(tmp_path),
        "max_local_disk_size": 0.02,
    }
    cache = make_cache(config, model="org/borrow")
    tensor = make_tensor((16, 64), torch.bfloat16, seed=9)
    assert cache.put("img", tensor) and cache.flush()
    with cache.borrow("img") as view:
        assert view is not None and torch.equal(view, tensor)
    assert cache.stats.snapshot()["hits"] == {"disk": 1}


_NEVER_CLOSED = """
import sys, threading, time, torch
from lmcache_ec import ECCache
from lmcache_ec.key import EncoderIdentity
cache = ECCache.from_config(
    {"local_cpu": True, "max_local_cpu_size": 0.05,
     "local_disk": sys.argv[1], "max_local_disk_size": 0.1},
    model="m",
)
def late():  # still using the cache after the main thread has returned
    time.sleep(0.5)
    cache.put("late", torch.ones(4, 8))
    print("late read", bool(torch.equal(cache.get("late"), torch.ones(4, 8))), flush=True)
threading.Thread(target=late).start()
"""


def test_a_cache_never_closed_does_not_keep_the_process_alive(tmp_path):
    # LMCache's event-loop thread is not a daemon: without the exit watch the
    # interpreter waits for it forever.
    try:
        done = subprocess.run(
            [sys.executable, "-c", _NEVER_CLOSED, str(tmp_path / "disk")],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a process whose cache was never closed did not exit")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "late read True" in done.stdout  # other threads finish their work first
