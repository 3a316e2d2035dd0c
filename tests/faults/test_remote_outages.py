"""The remote tier failing: unreachable, killed, stalled, silent. The engine keeps serving.

Redis and S3 run as real processes that are killed (SIGKILL), stopped
(SIGSTOP: the kernel still accepts connections, nothing answers) and started
again. Every answer is the exact tensor or a miss, no call raises, every call
returns within the configured ``remote_timeout`` (plus a margin), the outage
shows in the counters, and the time until remote hits resume is measured.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from lmcache_ec import ECCache
from tests.conftest import bit_equal, make_tensor
from tests.faults.checks import exact_or_miss, get_checked, put_checked, snapshot, wait_for
from tests.faults.processes import S3Process
from tests.remote.conftest import RETRY, TIMEOUT, outage_config
from tests.servers import Drip, RedisProcess, free_port

MODEL = "test/fault-model"
BOUND = TIMEOUT + 1.5  # "returns within the configured timeout", with a generous margin
RESUME_WITHIN = 5.0  # hits resume this soon after the server is back
NEVER_RECOVERS = 30.0  # generous: only catches a tier that does not come back


def _remote(cache: ECCache):
    return cache._storage.storage_backends["RemoteBackend"]


def _timed(call, *args, **kwargs):
    started = time.monotonic()
    result = call(*args, **kwargs)
    return result, time.monotonic() - started


def _within(bound: float, call, *args, **kwargs):
    """``(result, seconds)`` of ``call(*args, **kwargs)``, run in a thread; a failed assertion,
    without waiting any longer, if it is still running after ``bound`` seconds."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = call(*args, **kwargs)
        except BaseException as exc:
            box["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=run, name="bounded-call", daemon=True)
    thread.start()
    thread.join(bound)
    seconds = time.monotonic() - started
    name = getattr(call, "__name__", repr(call))
    assert not thread.is_alive(), f"{name}{args!r} still blocked after {seconds:.1f} s"
    if "error" in box:
        raise box["error"]
    return box["result"], seconds


def _assert_closed_promptly(cache: ECCache) -> None:
    _, seconds = _timed(cache.close)
    assert seconds < 5
    # The backends really stopped: LMCache's event-loop thread has exited.
    assert not cache._storage.thread.is_alive()


def _close_unblocked(stop_server, cache: ECCache) -> None:
    """``stop_server()``, then ``cache.close()`` within a bound: a call left
    blocked (a failed assertion) returns once the server hangs up."""
    stop_server()
    closer = threading.Thread(target=cache.close, daemon=True)
    closer.start()
    closer.join(4 * BOUND)


def _first_remote_hit(writer: ECCache, reader: ECCache, prefix: str) -> float:
    """Seconds until an entry written now is read back from the remote by ``reader``."""
    attempt = 0

    def remote_hit() -> bool:
        nonlocal attempt
        attempt += 1
        name = f"{prefix}-{attempt}"
        tensor = make_tensor((8, 32), torch.bfloat16, seed=1000 + attempt)
        assert put_checked(writer, name, tensor)
        writer.flush(5)
        before = snapshot(reader)["hits"].get("remote", 0)
        return get_checked(reader, name, tensor) and (
            snapshot(reader)["hits"].get("remote", 0) > before
        )

    return wait_for(remote_hit, NEVER_RECOVERS, "remote hits after recovery", interval=0.05)


def test_close_is_prompt_with_a_remote(remote, make_cache):
    cache = make_cache(outage_config(**remote), model=MODEL)
    cache.put("a", make_tensor((3, 8), torch.bfloat16))
    assert cache.get("a") is not None
    _assert_closed_promptly(cache)


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_silent_server_calls_return_within_the_timeout(
    kind, black_hole, aws_env, tmp_path, fault_table
):
    endpoint = f"http://127.0.0.1:{black_hole.port}"
    url = f"redis://127.0.0.1:{black_hole.port}" if kind == "redis" else "s3://bucket/p"
    config = outage_config(url, endpoint=endpoint if kind == "s3" else None)
    config["local_disk"] = str(tmp_path / "disk")
    # Every call runs under _within: a call that blocks on the silent server fails
    # its own assertion after BOUND (not pytest's timeout), with the server still
    # silent; the finally below then makes it answer, so the test cleans up.
    # An upload first, while the tier is up: it runs on the store's threads,
    # bounded by the client's socket timeouts alone (a read has a whole-call bound too).
    writer, _ = _within(BOUND, ECCache.from_config, config, model=MODEL)
    try:
        writer.put("uploaded", make_tensor((4, 8), torch.float16))
        _within(2 * BOUND, writer.flush, 10.0)
        assert snapshot(writer)["tiers"]["remote"]["available"] is False
    finally:
        _within(2 * BOUND, writer.close)
    cache, _ = _within(BOUND, ECCache.from_config, config, model=MODEL)
    try:
        tensor = make_tensor((4, 8), torch.float16)
        answer, slowest = _within(BOUND, cache.get, "never")  # a remote lookup that times out
        assert answer is None
        for call, args in (
            (cache.contains, ("never2",)),
            (cache.get, ("never3",)),
            (cache.put, ("local", tensor)),
        ):
            _, seconds = _within(BOUND, call, *args)
            slowest = max(slowest, seconds)
        _within(2 * BOUND, cache.flush, 10.0)
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
        # The stall is counted: the tier is marked unavailable after its first timeout.
        remote = snapshot(cache)["tiers"]["remote"]
        assert remote["available"] is False and remote["failures"] >= 1
        assert snapshot(cache)["tier_errors"]["remote"] >= 1
        _assert_closed_promptly(cache)
    finally:
        _close_unblocked(black_hole.close, cache)
    fault_table(
        f"network stall: {kind} endpoint accepts, never answers",
        f"slowest call {slowest:.2f} s (remote_timeout {TIMEOUT} s); misses, local tiers "
        "serve; tier marked unavailable",
        "n/a (never answers)",
    )


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_a_server_that_answers_a_byte_at_a_time_holds_no_read_past_the_timeout(
    kind, aws_env, tmp_path, fault_table
):
    # Each byte arrives well within the socket timeout; the answer never ends.
    drip = Drip("redis" if kind == "redis" else "http", interval=TIMEOUT / 5)
    endpoint = f"http://127.0.0.1:{drip.port}"
    url = f"redis://127.0.0.1:{drip.port}" if kind == "redis" else "s3://bucket/p"
    # No probe within the test: a reconnection would close the dripping socket
    # too, and only the read's own cut is under test.
    config = outage_config(
        url, endpoint=endpoint if kind == "s3" else None, remote_retry_interval=3600
    )
    cache, _ = _within(BOUND, ECCache.from_config, config, model=MODEL)
    try:
        answer, seconds = _within(BOUND, cache.get, "dripped")
        assert answer is None and drip.dripping.wait(BOUND)
        remote = snapshot(cache)["tiers"]["remote"]
        assert remote["available"] is False and remote["late_reads"] == 1
        assert _within(BOUND, cache.get, "dripped-too")[0] is None  # skipped while down
        if kind == "redis":  # the abandoned read was ended, not left to drip
            assert drip.cut.wait(BOUND)
        _assert_closed_promptly(cache)
    finally:
        _close_unblocked(drip.close, cache)
    fault_table(
        f"slow drip: {kind} sends an answer a byte at a time",
        f"read given up after {seconds:.2f} s (remote_timeout {TIMEOUT} s); a miss, "
        "tier marked unavailable",
        "n/a (never answers)",
    )


def test_removing_a_damaged_entry_from_a_slow_server_holds_no_read_past_the_timeout(tmp_path):
    # A damaged value at once, then a DEL answered a digit at a time: the read's
    # removal of the damage is bounded like the read itself.
    drip = Drip(
        "redis", interval=TIMEOUT / 5, drip_on=b"DEL", replies={b"GETRANGE": b"$5\r\nhello\r\n"}
    )
    config = outage_config(f"redis://127.0.0.1:{drip.port}")
    cache, _ = _within(BOUND, ECCache.from_config, config, model=MODEL)
    try:
        answer, _ = _within(2 * BOUND, cache.get, "damaged")
        assert answer is None and drip.dripping.wait(BOUND)
        assert snapshot(cache)["integrity_failures"] == 1
        assert snapshot(cache)["tiers"]["remote"]["late_reads"] == 1
    finally:
        _close_unblocked(drip.close, cache)


def test_unreachable_at_start_then_server_appears(tmp_path, fault_table, make_cache):
    port = free_port()  # nothing listens here yet
    url = f"redis://127.0.0.1:{port}"
    config = outage_config(url, local_disk=str(tmp_path / "disk"))
    cache, seconds = _timed(ECCache.from_config, config, model=MODEL)
    assert seconds < BOUND
    assert cache.tiers == ["cpu", "disk", "remote"]
    tensor = make_tensor((6, 10), torch.bfloat16)
    assert cache.put("early", tensor)
    assert cache.get("missing") is None
    assert not _remote(cache).available
    assert cache.stats.snapshot()["tiers"]["remote"]["available"] is False
    assert snapshot(cache)["tier_errors"]["remote"] >= 1
    server = RedisProcess(port=port, workdir=str(tmp_path))
    server.start()
    started = time.monotonic()
    try:
        deadline = time.monotonic() + RESUME_WITHIN
        while not _remote(cache).available and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _remote(cache).available
        recovery = time.monotonic() - started
        cache.put("late", tensor)
        assert cache.flush(10)
        with make_cache(outage_config(url), model=MODEL) as reader:
            assert bit_equal(reader.get("late"), tensor)
        assert bit_equal(cache.get("early"), tensor)  # local entries were never lost
        _assert_closed_promptly(cache)
    finally:
        server.kill()
    fault_table(
        "Redis unreachable at start",
        "engine starts; puts stay local; lookups miss on the remote",
        recovery,
    )


def test_redis_killed_mid_workload(redis_process, tmp_path, fault_table, make_cache):
    """Writer and reader share Redis; it dies and returns while they work."""
    url = redis_process.url
    writer = make_cache(outage_config(url), model=MODEL)
    reader = make_cache(outage_config(url), model=MODEL)
    written: dict[str, torch.Tensor] = {}
    answers = {"hit": 0, "miss": 0}
    killed_at = restarted_at = resumed_at = None
    i = 0
    while True:
        mm_hash = f"frame-{i}"
        tensor = make_tensor((8, 32), torch.bfloat16, seed=i)
        assert put_checked(writer, mm_hash, tensor)
        written[mm_hash] = tensor
        writer.flush(5)
        if not get_checked(reader, mm_hash, tensor):  # a hit is never a wrong tensor
            answers["miss"] += 1
        else:
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
    snapshot_ = reader.stats.snapshot()
    assert snapshot_["tier_errors"]["remote"] >= 1
    assert snapshot_["tiers"]["remote"]["available"] is True
    assert snapshot_["tiers"]["remote"]["reconnects"] >= 1
    _assert_closed_promptly(writer)
    _assert_closed_promptly(reader)
    fault_table(
        "Redis killed (SIGKILL) and restarted mid-workload",
        f"{answers['miss']} reads missed during the outage, {answers['hit']} exact hits, "
        "0 wrong; writer kept every entry locally",
        resumed_at - restarted_at,
    )


def test_writes_made_during_an_outage_reach_the_remote_when_it_returns(
    redis_process, tmp_path, fault_table, make_cache
):
    url = redis_process.url
    writer = make_cache(outage_config(url, local_disk=str(tmp_path / "disk")), model=MODEL)
    tensors = {f"offline-{i}": make_tensor((8, 32), torch.bfloat16, seed=i) for i in range(6)}
    try:
        redis_process.kill()
        for name, tensor in tensors.items():
            assert writer.put(name, tensor)  # local tiers take them; the remote is down
        assert writer.flush(10)
        remote = writer.stats.snapshot()["tiers"]["remote"]
        assert remote["available"] is False and remote["awaiting_resend"] == len(tensors)

        redis_process.restart()
        restarted_at = time.monotonic()
        deadline = time.monotonic() + RESUME_WITHIN + 5
        while writer.stats.snapshot()["tiers"]["remote"].get("resent", 0) < len(tensors):
            assert time.monotonic() < deadline, writer.stats.snapshot()["tiers"]["remote"]
            time.sleep(0.05)
        assert writer.flush(10)
        resent_after = time.monotonic() - restarted_at
        # Another instance with empty local tiers now finds every entry remotely.
        with make_cache(outage_config(url), model=MODEL) as reader:
            for name, tensor in tensors.items():
                assert bit_equal(reader.get(name), tensor)
        assert writer.stats.snapshot()["tiers"]["remote"]["awaiting_resend"] == 0
    finally:
        _assert_closed_promptly(writer)
    fault_table(
        "writes during a Redis outage",
        f"{len(tensors)} puts kept locally, keys remembered; re-sent (verified) on recovery",
        resent_after,
    )


def test_redis_stalled_mid_workload(redis_process, fault_table, make_cache):
    """SIGSTOP: connections are still accepted by the kernel, nothing answers."""
    url = redis_process.url
    writer = make_cache(outage_config(url), model=MODEL)
    reader = make_cache(outage_config(url), model=MODEL)
    tensors = {f"before-{i}": make_tensor((8, 32), torch.float16, seed=i) for i in range(5)}
    try:
        for name, tensor in tensors.items():
            assert put_checked(writer, name, tensor)
        assert writer.flush(10)
        assert all(get_checked(reader, name, t) for name, t in tensors.items())

        os.kill(redis_process.proc.pid, signal.SIGSTOP)
        try:
            stalled = {
                f"during-{i}": make_tensor((8, 32), torch.float16, seed=50 + i) for i in range(5)
            }
            slowest = 0.0
            for name, tensor in stalled.items():
                stored, seconds = _timed(put_checked, writer, name, tensor)
                assert stored
                slowest = max(slowest, seconds)
                _, seconds = _timed(get_checked, reader, name, tensor)
                slowest = max(slowest, seconds)
                assert seconds < BOUND
            assert _timed(writer.flush, 10.0)[1] < 2 * BOUND
            # The writer still answers from its CPU tier; the reader misses.
            assert all(get_checked(writer, name, t) for name, t in stalled.items())
            for cache in (writer, reader):
                state = snapshot(cache)
                assert state["tiers"]["remote"]["available"] is False
                assert state["tier_errors"]["remote"] >= 1
        finally:
            os.kill(redis_process.proc.pid, signal.SIGCONT)
        resumed = _first_remote_hit(writer, reader, "after-stall")
        assert snapshot(reader)["tiers"]["remote"]["reconnects"] >= 1
        # Entries written before the stall are still served, exactly.
        assert all(get_checked(reader, name, t) for name, t in tensors.items())
        _assert_closed_promptly(writer)
        _assert_closed_promptly(reader)
    finally:
        writer.close()
        reader.close()
    fault_table(
        "Redis stalled (SIGSTOP) mid-workload, then resumed",
        f"slowest call {slowest:.2f} s (remote_timeout {TIMEOUT} s); reader misses, "
        "writer serves from CPU",
        resumed,
    )


def test_s3_server_killed_mid_workload(aws_env, fault_table, make_cache):
    server = S3Process()
    server.start()
    bucket = "ec-faults"
    server.client().create_bucket(Bucket=bucket)
    config = outage_config(f"s3://{bucket}/ec", endpoint=server.endpoint)
    try:
        writer = make_cache(config, model=MODEL)
        reader = make_cache(config, model=MODEL)
    except BaseException:
        server.kill()
        raise
    try:
        before = {f"before-{i}": make_tensor((16, 64), torch.bfloat16, seed=i) for i in range(8)}
        for name, tensor in before.items():
            assert put_checked(writer, name, tensor)
        assert writer.flush(10)
        assert all(get_checked(reader, name, t) for name, t in before.items())

        server.kill()
        during = {
            f"during-{i}": make_tensor((16, 64), torch.bfloat16, seed=100 + i) for i in range(6)
        }
        misses = 0
        for name, tensor in during.items():
            stored, seconds = _timed(put_checked, writer, name, tensor)
            assert stored and seconds < BOUND
            hit, seconds = _timed(get_checked, reader, name, tensor)
            assert seconds < BOUND
            misses += not hit
        assert _timed(writer.flush, 10.0)[1] < 2 * BOUND
        assert misses == len(during)
        assert all(get_checked(writer, name, t) for name, t in during.items())
        for cache in (writer, reader):
            state = snapshot(cache)
            assert state["tiers"]["remote"]["available"] is False
            assert state["tier_errors"]["remote"] >= 1
        assert snapshot(writer)["tiers"]["remote"]["awaiting_resend"] >= 1

        # A crashed S3 endpoint comes back empty here (moto keeps state in memory).
        server.start()
        server.client().create_bucket(Bucket=bucket)
        resumed = _first_remote_hit(writer, reader, "after-restart")
        # What was written during the outage is re-sent and reaches other instances.
        wait_for(
            lambda: (
                snapshot(writer)["tiers"]["remote"]["awaiting_resend"] == 0
                and writer.pending_writes() == 0
            ),
            NEVER_RECOVERS,
            "outage writes re-sent",
        )
        with make_cache(config, model=MODEL) as fresh:
            for name, tensor in during.items():
                assert get_checked(fresh, name, tensor)
            # Entries the crashed server lost are misses, never wrong tensors.
            for name, tensor in before.items():
                exact_or_miss(fresh.get(name), tensor)
        for cache in (writer, reader):
            assert snapshot(cache)["tiers"]["remote"]["reconnects"] >= 1
        _assert_closed_promptly(writer)
        _assert_closed_promptly(reader)
    finally:
        writer.close()
        reader.close()
        server.kill()
    fault_table(
        "S3 server killed (SIGKILL), restarted empty",
        f"{misses}/{len(during)} reads missed during the outage, calls bounded; outage "
        "writes re-sent on recovery",
        resumed,
    )
