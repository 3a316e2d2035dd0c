"""The remote tier failing: unreachable, dying, silent. The engine keeps serving."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from lmcache_ec import ECCache
from tests.conftest import bit_equal, make_tensor
from tests.remote.conftest import RETRY, TIMEOUT, remote_config
from tests.servers import RedisProcess, free_port

MODEL = "test/fault-model"
BOUND = TIMEOUT + 1.5  # "returns within the configured timeout", with a generous margin
RESUME_WITHIN = 5.0  # hits resume this soon after the server is back


def _remote(cache: ECCache):
    return cache._storage.storage_backends["RemoteBackend"]


def _timed(call, *args, **kwargs):
    started = time.monotonic()
    result = call(*args, **kwargs)
    return result, time.monotonic() - started


def _assert_closed_promptly(cache: ECCache) -> None:
    _, seconds = _timed(cache.close)
    assert seconds < 5
    # The backends really stopped: LMCache's event-loop thread has exited.
    assert not cache._storage.thread.is_alive()


def test_close_is_prompt_with_a_remote(remote):
    cache = ECCache.from_config(remote_config(**remote), model=MODEL)
    cache.put("a", make_tensor((3, 8), torch.bfloat16))
    assert cache.get("a") is not None
    _assert_closed_promptly(cache)


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_silent_server_calls_return_within_the_timeout(kind, black_hole, aws_env, tmp_path):
    endpoint = f"http://127.0.0.1:{black_hole.port}"
    url = f"redis://127.0.0.1:{black_hole.port}" if kind == "redis" else "s3://bucket/p"
    config = remote_config(url, endpoint=endpoint if kind == "s3" else None)
    config["local_disk"] = str(tmp_path / "disk")
    cache, seconds = _timed(ECCache.from_config, config, model=MODEL)
    assert seconds < BOUND
    tensor = make_tensor((4, 8), torch.float16)
    assert cache.get("never") is None  # a remote lookup that times out
    assert _timed(cache.contains, "never2")[1] < BOUND
    assert _timed(cache.get, "never3")[1] < BOUND
    assert _timed(cache.put, "local", tensor)[1] < BOUND
    assert _timed(cache.flush, 10.0)[1] < 2 * BOUND
    assert bit_equal(cache.get("local"), tensor)
    assert cache.contains("local") == "cpu"
    assert cache.stats.snapshot()["misses"] == 1 + 1  # never, never3
    # No pile-up: many lookups from several threads leave no threads behind.
    before = threading.active_count()
    workers = [
        threading.Thread(target=lambda i=i: [cache.get(f"miss-{i}-{j}") for j in range(20)])
        for i in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=4 * BOUND)
        assert not worker.is_alive()
    assert threading.active_count() <= before + 1
    _assert_closed_promptly(cache)


def test_unreachable_at_start_then_server_appears(tmp_path):
    port = free_port()  # nothing listens here yet
    url = f"redis://127.0.0.1:{port}"
    config = remote_config(url, local_disk=str(tmp_path / "disk"))
    cache, seconds = _timed(ECCache.from_config, config, model=MODEL)
    assert seconds < BOUND
    assert cache.tiers == ["cpu", "disk", "remote"]
    tensor = make_tensor((6, 10), torch.bfloat16)
    assert cache.put("early", tensor)
    assert cache.get("missing") is None
    assert not _remote(cache).available
    assert cache.stats.snapshot()["tiers"]["remote"]["available"] is False
    server = RedisProcess(port=port, workdir=str(tmp_path))
    server.start()
    try:
        deadline = time.monotonic() + RESUME_WITHIN
        while not _remote(cache).available and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _remote(cache).available
        cache.put("late", tensor)
        assert cache.flush(10)
        with ECCache.from_config(remote_config(url), model=MODEL) as reader:
            assert bit_equal(reader.get("late"), tensor)
        assert bit_equal(cache.get("early"), tensor)  # local entries were never lost
        _assert_closed_promptly(cache)
    finally:
        server.kill()


def test_redis_killed_mid_workload(redis_process, tmp_path):
    """Writer and reader share Redis; it dies and returns while they work."""
    url = redis_process.url
    writer = ECCache.from_config(remote_config(url), model=MODEL)
    reader = ECCache.from_config(remote_config(url), model=MODEL)
    written: dict[str, torch.Tensor] = {}
    answers = {"hit": 0, "miss": 0}
    killed_at = restarted_at = resumed_at = None
    i = 0
    while True:
        mm_hash = f"frame-{i}"
        tensor = make_tensor((8, 32), torch.bfloat16, seed=i)
        assert writer.put(mm_hash, tensor)
        written[mm_hash] = tensor
        writer.flush(5)
        got = reader.get(mm_hash)
        if got is None:
            answers["miss"] += 1
        else:
            assert bit_equal(got, tensor)  # a hit is never a wrong tensor
            answers["hit"] += 1
            if restarted_at is not None and resumed_at is None:
                resumed_at = time.monotonic()
                break
        i += 1
        if i == 20:
            redis_process.kill()
            killed_at = time.monotonic()
        if killed_at and restarted_at is None and time.monotonic() - killed_at > 3 * RETRY + 1:
            redis_process.restart()
            restarted_at = time.monotonic()
        if restarted_at and time.monotonic() - restarted_at > RESUME_WITHIN + 5:
            break
        time.sleep(0.02)

    assert answers["hit"] >= 20 and answers["miss"] >= 1
    assert resumed_at is not None and resumed_at - restarted_at <= RESUME_WITHIN
    for mm_hash, tensor in written.items():  # nothing stored locally was lost
        assert bit_equal(writer.get(mm_hash), tensor)
    assert _remote(writer).counters["reconnects"] >= 1
    assert _remote(reader).counters["reconnects"] >= 1
    # The outage is visible in the stats exporters read, not only in logs.
    snapshot = reader.stats.snapshot()
    assert snapshot["tier_errors"]["remote"] >= 1
    assert snapshot["tiers"]["remote"]["available"] is True
    assert snapshot["tiers"]["remote"]["reconnects"] >= 1
    _assert_closed_promptly(writer)
    _assert_closed_promptly(reader)


def test_writes_made_during_an_outage_reach_the_remote_when_it_returns(redis_process, tmp_path):
    url = redis_process.url
    writer = ECCache.from_config(remote_config(url, local_disk=str(tmp_path / "disk")), model=MODEL)
    tensors = {f"offline-{i}": make_tensor((8, 32), torch.bfloat16, seed=i) for i in range(6)}
    try:
        redis_process.kill()
        for name, tensor in tensors.items():
            assert writer.put(name, tensor)  # local tiers take them; the remote is down
        assert writer.flush(10)
        remote = writer.stats.snapshot()["tiers"]["remote"]
        assert remote["available"] is False and remote["awaiting_resend"] == len(tensors)

        redis_process.restart()
        deadline = time.monotonic() + RESUME_WITHIN + 5
        while writer.stats.snapshot()["tiers"]["remote"].get("resent", 0) < len(tensors):
            assert time.monotonic() < deadline, writer.stats.snapshot()["tiers"]["remote"]
            time.sleep(0.05)
        assert writer.flush(10)
        # Another instance with empty local tiers now finds every entry remotely.
        with ECCache.from_config(remote_config(url), model=MODEL) as reader:
            for name, tensor in tensors.items():
                assert bit_equal(reader.get(name), tensor)
        assert writer.stats.snapshot()["tiers"]["remote"]["awaiting_resend"] == 0
    finally:
        _assert_closed_promptly(writer)
