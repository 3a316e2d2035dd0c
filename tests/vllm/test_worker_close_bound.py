"""Shutting the worker connector down is bounded by one ``close_timeout`` in all.

``TierWorker.close`` waits for queued saves, for the staging thread, then for
the cache's own flush and stop: one deadline covers them, each wait gets what
the ones before it left. With a save whose put never ends, a staging read and
remote uploads waiting on a remote that never answers, close returns within
about ``close_timeout`` (not once per wait) and the cache is closed. The parts
keep the bound on their own: ``SaveQueue.close(timeout)`` waits for its saves
and its thread within ``timeout``, ``ECCache.close(timeout=...)`` flushes and
stops its tiers within ``timeout`` (default ``close_timeout``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.saver import SaveQueue
from lmcache_ec.integration.vllm.worker import TierWorker
from tests.conftest import make_tensor
from tests.remote.conftest import remote_config
from tests.servers import BlackHole

CLOSE_S = 0.5  # close_timeout: the bound under test
HUNG_S = 30.0  # remote_timeout: no remote call ends while a test runs
POLL_S = 10.0  # bound on waiting for a background step to start


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + POLL_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {POLL_S} s"
        time.sleep(0.005)


def _seconds(call, *args, **kwargs) -> float:
    started = time.monotonic()
    call(*args, **kwargs)
    return time.monotonic() - started


def _hung_remote(black_hole: BlackHole, **extra) -> dict:
    return remote_config(f"redis://127.0.0.1:{black_hole.port}", remote_timeout=HUNG_S, **extra)


@pytest.fixture
def stuck() -> Iterator[threading.Event]:
    """Set when the test ends: the puts held until then go on (into a closed cache)."""
    release = threading.Event()
    yield release
    release.set()


def test_a_worker_with_every_wait_stuck_closes_within_one_close_timeout(
    black_hole, make_cache, monkeypatch, stuck
):
    cache = make_cache(_hung_remote(black_hole, close_timeout=CLOSE_S), model="org/close")
    worker = TierWorker(
        cache,
        ConnectorSettings(),
        persistable=lambda identifier: True,
        is_producer=True,
        is_consumer=True,
    )
    # An accepted write whose upload to the remote never ends: the cache's flush waits.
    assert cache.put("uploaded", make_tensor((4, 8), torch.float32))
    assert cache.pending_writes() >= 1
    # A save whose put never ends (a tier write waiting on a lock held elsewhere).
    entered = threading.Event()
    put = cache.put

    def stuck_put(*args, **kwargs):
        entered.set()
        stuck.wait()
        return put(*args, **kwargs)

    monkeypatch.setattr(cache, "put", stuck_put)
    worker.save_caches({"saved": make_tensor((4, 8), torch.float32)}, "saved")
    _wait_until(entered.is_set, "the save's put")
    # A staging read of an entry only the remote could hold: it waits on the remote.
    worker.stage(["on-the-remote"], None, None, 1)
    _wait_until(worker._stage_queue.empty, "the staging read")

    took = _seconds(worker.close)

    assert took < 2 * CLOSE_S, f"close took {took:.2f} s, close_timeout {CLOSE_S} s"
    with pytest.raises(RuntimeError, match="closed"):
        cache.get("uploaded")


def test_a_save_queue_with_a_stuck_put_closes_within_its_timeout(stuck):
    entered = threading.Event()

    def stuck_put(identifier, tensor, tag) -> bool:
        entered.set()
        return stuck.wait()

    saves = SaveQueue(stuck_put, lambda identifier, stored, seconds, tag: None, 4)
    assert saves.submit("img", make_tensor((4, 8), torch.float32))
    _wait_until(entered.is_set, "the put")

    took = _seconds(saves.close, CLOSE_S)

    # The flush alone takes the whole timeout: a join with a timeout of its own doubles it.
    assert took < 1.5 * CLOSE_S, f"close took {took:.2f} s, timeout {CLOSE_S} s"


def test_a_cache_closed_with_a_timeout_waits_no_longer_than_it(black_hole, make_cache):
    cache = make_cache(_hung_remote(black_hole, close_timeout=4 * CLOSE_S), model="org/close")
    assert cache.put("uploaded", make_tensor((4, 8), torch.float32))
    assert cache.pending_writes() >= 1  # an upload the remote never answers

    took = _seconds(cache.close, timeout=CLOSE_S)

    assert took < 2 * CLOSE_S, f"close took {took:.2f} s, timeout {CLOSE_S} s"
    with pytest.raises(RuntimeError, match="closed"):
        cache.get("uploaded")
