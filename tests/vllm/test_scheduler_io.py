"""The scheduler side never waits on the network: remote checks run in a thread."""

from __future__ import annotations

import logging
import time

import redis
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory

from lmcache_ec.bench.proxy import SlowProxy

from .harness import image_hash, lone_request, make_vllm_config


def _exists_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_exists", {}).get("calls", 0))


def _scheduler_connector(model_config, remote_url: str):
    extra = {
        "lmcache_config": {"max_local_cpu_size": 0.01, "remote_url": remote_url},
        "remote_lookup_timeout_s": 0.2,
        "weights_fingerprint": False,  # no workers here to announce a fingerprint
    }
    config = make_vllm_config(model_config, "ec_both", extra)
    return ECConnectorFactory.create_connector(config, ECConnectorRole.SCHEDULER)


def test_has_cache_item_sends_no_command_to_redis(model_config, redis_url):
    client = redis.Redis.from_url(redis_url)
    connector = _scheduler_connector(model_config, redis_url)
    try:
        identifier = image_hash("remote.png")
        before = _exists_calls(client)
        for _ in range(1000):
            assert not connector.has_cache_item(identifier)
        assert _exists_calls(client) == before  # has_cache_item: memory only

        request = lone_request(identifier)
        deadline = time.monotonic() + 10
        while not connector.ensure_cache_available(request, 0):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # However often the scheduler asked, the background thread checked once.
        assert _exists_calls(client) == before + 1
        assert connector.scheduler.index.remote_lookups == 1
    finally:
        connector.shutdown()


def test_unresponsive_remote_never_blocks_scheduling(model_config, black_hole):
    connector = _scheduler_connector(model_config, f"redis://127.0.0.1:{black_hole.port}")
    try:
        request = lone_request(image_hash("slow.png"))
        started = time.monotonic()
        calls = 0
        while not connector.ensure_cache_available(request, 0):
            calls += 1
            time.sleep(0.01)
        waited = time.monotonic() - started
        # Deferred only until remote_lookup_timeout_s (0.2 s); the store never answers.
        assert calls >= 1
        assert waited < 1.5  # generous upper bound; remote_timeout is 2 s
        assert not connector.has_cache_item(request.mm_features[0].identifier)
    finally:
        connector.shutdown()


def test_failing_remote_pauses_lookups_instead_of_queuing(model_config, black_hole, caplog):
    caplog.set_level(logging.WARNING, logger="lmcache_ec.integration.vllm.index")
    connector = _scheduler_connector(model_config, f"redis://127.0.0.1:{black_hole.port}")
    index = connector.scheduler.index
    try:
        assert index.lookup(image_hash("first.png")) == "pending"
        deadline = time.monotonic() + 15
        while index.remote_failures == 0:  # the one lookup times out (remote_timeout)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # While paused, new items are answered "absent" at once and nothing is queued.
        for i in range(100):
            assert index.lookup(image_hash(f"later-{i}.png")) is None
        assert not index._pending
        assert index.remote_lookups == 0  # an unanswered lookup is never cached
        # One line says so, with the store's own error (here: its timeout).
        paused = [r.getMessage() for r in caplog.records if "lookups paused" in r.getMessage()]
        assert len(paused) == 1 and "Timeout" in paused[0], paused
    finally:
        connector.shutdown()


def test_lookups_asked_meanwhile_share_one_round_trip(model_config, redis_url, redis_server):
    proxy = SlowProxy(redis_server.port, 0.2)
    connector = _scheduler_connector(model_config, proxy.url)
    index = connector.scheduler.index
    try:
        identifiers = [image_hash(f"batched-{i}.png") for i in range(40)]
        for identifier in identifiers:
            assert index.lookup(identifier) == "pending"
        deadline = time.monotonic() + 20
        while index.remote_lookups < len(identifiers):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert all(index.lookup(identifier) is None for identifier in identifiers)
        # Connection set-up plus at most two pipelined batches, not 40 round trips.
        assert proxy.chunks <= 8
    finally:
        connector.shutdown()
        proxy.close()


def test_the_scheduler_side_shuts_down_within_one_close_timeout(model_config, black_hole, tmp_path):
    """A remote lookup and a claim stuck on a remote that never answers: the
    scheduler side's shutdown (claims, index threads, channel) still returns
    within ``close_timeout`` in all, not a fixed 2 s per thread."""
    close_s = 0.5
    extra = {
        "lmcache_config": {
            "max_local_cpu_size": 0.01,
            "local_disk": str(tmp_path / "disk"),
            "remote_url": f"redis://127.0.0.1:{black_hole.port}",
            "remote_timeout": 30.0,
            "close_timeout": close_s,
        },
        "remote_lookup_timeout_s": 0.1,
        "weights_fingerprint": False,
    }
    config = make_vllm_config(model_config, "ec_both", extra)
    connector = ECConnectorFactory.create_connector(config, ECConnectorRole.SCHEDULER)
    request = lone_request(image_hash("stuck.png"))
    deadline = time.monotonic() + 10
    while not connector.ensure_cache_available(request, 0):  # lookup given up: encode
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert connector.scheduler.index._thread.is_alive()  # its lookup still waits

    started = time.monotonic()
    connector.shutdown()
    took = time.monotonic() - started

    assert took < 2 * close_s, f"shutdown took {took:.2f} s, close_timeout {close_s} s"
