"""A process that cannot start a thread for a moment (a container's pids limit,
RLIMIT_NPROC, an address-space limit that leaves no room for a stack).

Each thread the tiers start when first needed is published only once it runs:
a start that failed is a skipped write or a miss, never an error raised to the
caller, and the next call starts it. A cache that fails to start leaves no
thread that keeps the process from exiting. The failing start is
``threading.Thread.start`` raising as CPython does ("can't start new thread")
for threads of one name: root is exempt from the kernel's limits.
"""

from __future__ import annotations

import textwrap
import threading

import pytest
import torch

from tests.conftest import bit_equal, make_tensor
from tests.faults.processes import worker
from tests.remote.conftest import remote_config

MODEL = "test/thread-limits"


@pytest.fixture
def refuse_thread(monkeypatch):
    """``refuse_thread(prefix)``: the next start of a thread whose name begins
    with ``prefix`` fails; returns the list of refused names."""

    def refuse(prefix: str) -> list[str]:
        refused: list[str] = []
        start = threading.Thread.start

        def failing_start(thread: threading.Thread) -> None:
            if thread.name.startswith(prefix) and not refused:
                refused.append(thread.name)
                raise RuntimeError("can't start new thread")
            start(thread)

        monkeypatch.setattr(threading.Thread, "start", failing_start)
        return refused

    return refuse


def test_a_disk_write_whose_thread_cannot_start_is_skipped_and_the_next_lands(
    disk_dir, make_cache, refuse_thread
):
    config = {"local_cpu": False, "max_local_cpu_size": 0.05, "local_disk": str(disk_dir)}
    cache = make_cache(config, model=MODEL)
    refused = refuse_thread("ec-disk-writer")
    first, second = make_tensor((8, 32), torch.float16, seed=1), make_tensor((8, 32), torch.float16)
    cache.put("first", first)  # its write is skipped: no error reaches the caller
    assert refused
    assert cache.put("second", second)
    assert cache.flush(10)  # the writer started this time: nothing left pending
    assert bit_equal(cache.get("second"), second)
    assert cache.get("first") is None


def test_a_disk_hit_whose_promotion_thread_cannot_start_is_served(
    disk_dir, make_cache, refuse_thread
):
    config = {"local_cpu": True, "max_local_cpu_size": 0.05, "local_disk": str(disk_dir)}
    tensor = make_tensor((8, 32), torch.float16)
    with make_cache(config, model=MODEL) as writer:
        assert writer.put("img", tensor)
        assert writer.flush(10)
    reader = make_cache(config, model=MODEL)  # its CPU tier is empty: a disk hit
    refused = refuse_thread("ec-promote")
    assert bit_equal(reader.get("img"), tensor)  # served; its promotion skipped
    assert refused
    assert bit_equal(reader.get("img"), tensor)


def test_close_without_a_thread_to_close_with_closes_all_the_same(make_cache, refuse_thread):
    cache = make_cache(model=MODEL)
    assert cache.put("img", make_tensor((8, 32), torch.float16))
    refused = refuse_thread("ec-close")
    cache.close()
    assert refused
    assert not cache._storage.thread.is_alive()  # LMCache's event loop stopped


def test_a_remote_read_whose_thread_cannot_start_is_a_miss_not_an_outage(
    redis_url, make_cache, refuse_thread
):
    tensor = make_tensor((8, 32), torch.float16)
    config = remote_config(redis_url, local_cpu=False)
    with make_cache(config, model=MODEL) as writer:
        assert writer.put("img", tensor)
        assert writer.flush(10)
    reader = make_cache(config, model=MODEL)
    remote = reader._storage.storage_backends["RemoteBackend"]
    refused = refuse_thread("ec-remote-read")
    assert reader.get("img") is None
    assert refused and remote.available  # this process was short of threads, not the store
    assert remote.counters["reads_busy"] == 1
    assert bit_equal(reader.get("img"), tensor)


def test_a_cache_that_cannot_start_its_threads_leaves_a_process_that_exits():
    """The start fails at its exit watch, after LMCache's (non-daemon) event loop
    started: the error reaches the caller and the process still exits."""
    script = textwrap.dedent(
        """
        import threading
        start = threading.Thread.start
        def failing_start(thread):
            if thread.name == "ec-exit-watch":
                raise RuntimeError("can't start new thread")
            start(thread)
        threading.Thread.start = failing_start
        import torch
        from lmcache_ec import ECCache
        try:
            ECCache.from_config({"max_local_cpu_size": 0.05}, model="m", dtype=torch.float16)
        except RuntimeError as exc:
            print("start failed:", exc)
        """
    )
    child = worker(script)
    try:
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err[-2000:]
    assert "start failed: can't start new thread" in out
