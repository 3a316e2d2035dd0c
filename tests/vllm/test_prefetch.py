"""Remote hits are prefetched while their request waits; the batch never does.

vLLM's real Scheduler, a real redis-server behind a proxy that delays every
command, and the worker-side connector calls of the model runner.
"""

from __future__ import annotations

import pytest
import redis

from lmcache_ec.bench.proxy import SlowProxy
from tests.conftest import bit_equal

from .harness import Engine, encoder_output, image_hash, make_vllm_config

DELAY_S = 0.05  # per command, as across a data centre


def _engine(model_config, role: str, extra: dict, monkeypatch) -> Engine:
    """An engine whose connector knows it runs the V2 runner's hooks, idle steps too.

    VllmConfig refuses V2 without Triton; the connector only reads the flag.
    """
    config = make_vllm_config(model_config, role, extra)
    with monkeypatch.context() as patch:
        patch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
        return Engine(config)


def _extra(remote_url: str, **settings) -> dict:
    return {
        "lmcache_config": {"max_local_cpu_size": 0.01, "remote_url": remote_url},
        "remote_lookup_timeout_s": 5.0,
        **settings,
    }


def _store_in_redis(model_config, redis_url: str, images: list[str]) -> None:
    """Another instance encodes ``images`` and shares them through Redis only."""
    engine = Engine(make_vllm_config(model_config, "ec_both", _extra(redis_url)))
    try:
        engine.run_until_finished([engine.add_request([image]) for image in images])
        assert sorted(engine.encoded) == sorted(images)
        engine.flush()
    finally:
        engine.shutdown()


@pytest.fixture
def slow_redis(redis_url, redis_server):
    proxy = SlowProxy(redis_server.port, DELAY_S)
    yield proxy
    proxy.close()


def _watch_loads(engine: Engine, staged_before_load: list[bool]) -> None:
    """Record, at each worker load, whether its items were already in worker memory."""
    connector = engine.workers[0]
    original = connector.start_load_caches

    def start_load_caches(encoder_cache, **kwargs):
        meta = connector._get_connector_metadata()
        staged = connector.worker.staged.current
        staged_before_load.extend(identifier in staged for identifier in meta.loads)
        return original(encoder_cache, **kwargs)

    connector.start_load_caches = start_load_caches


def test_remote_hit_defers_its_request_not_the_batch(
    model_config, redis_url, slow_redis, monkeypatch
):
    image = image_hash("only-in-redis.png")
    _store_in_redis(model_config, redis_url, [image])

    engine = _engine(model_config, "ec_both", _extra(slow_redis.url), monkeypatch)
    staged_before_load: list[bool] = []
    _watch_loads(engine, staged_before_load)
    try:
        busy = engine.add_request([], max_tokens=400)  # local work: decodes every step
        engine.step()  # running: a wait for the remote would now delay its steps
        local_image = image_hash("computed-here.png")
        local = engine.add_request([local_image], max_tokens=2)
        remote = engine.add_request([image])
        engine.run_until_finished([remote, local])

        waited = [step for step in engine.scheduled if remote not in step and busy in step]
        first_remote_step = next(i for i, step in enumerate(engine.scheduled) if remote in step)
        # The remote request waited steps while the others kept being scheduled.
        assert len(waited) >= 1
        assert all(busy in step for step in engine.scheduled[: first_remote_step + 1])
        # Scheduled with no encoder work, loaded from worker memory, bit-exact.
        assert image not in engine.encoded
        assert local_image in engine.encoded
        assert bit_equal(engine.gathered[image], encoder_output(image))
        assert staged_before_load == [True]
        assert engine.ec_stats.get("load_direct_reads", 0) == 0  # no tier read in a step
        assert engine.ec_stats["hits_remote"] == 1
        assert engine.ec_stats["scheduler_prefetch_queued"] == 1
        assert engine.ec_stats["scheduler_deferred_steps"] >= len(waited)
    finally:
        engine.shutdown()


def _corrupt_all(redis_url: str) -> int:
    client = redis.Redis.from_url(redis_url)
    keys = [key for key in client.keys("*") if client.type(key) == b"string"]
    for key in keys:
        value = bytearray(client.get(key))
        value[-1] ^= 0xFF  # payload byte: the frame checksum no longer matches
        client.set(key, bytes(value))
    return len(keys)


@pytest.mark.parametrize("failure", ["corrupt", "timeout"])
@pytest.mark.parametrize("role", ["ec_both", "ec_consumer"])
def test_failed_prefetch(model_config, redis_url, redis_server, role, failure, monkeypatch):
    image = image_hash(f"fails-{failure}.png")
    _store_in_redis(model_config, redis_url, [image])
    if failure == "corrupt":
        assert _corrupt_all(redis_url) >= 1
        proxy = SlowProxy(redis_server.port, DELAY_S)
        settings = {}
    else:
        proxy = SlowProxy(redis_server.port, 0.6)  # slower than the prefetch may take
        settings = {"stage_timeout_s": 0.3}
    engine = _engine(model_config, role, _extra(proxy.url, **settings), monkeypatch)
    try:
        request = engine.add_request([image])
        engine.run_until_finished([request], max_steps=5000)
        given_up = engine.ec_stats["scheduler_stage_given_up"]
        assert given_up == 1
        if role == "ec_both":
            assert engine.finished[request] == "length"  # completed ...
            assert engine.encoded == [image]  # ... by running the encoder
            assert bit_equal(engine.gathered[image], encoder_output(image))
        else:
            assert engine.finished[request] == "error"  # failed, retryable
            assert image not in engine.gathered
            assert engine.ec_stats["scheduler_unavailable_requests"] == 1
    finally:
        engine.shutdown()
        proxy.close()


def test_prefetches_are_bounded_shared_and_in_arrival_order(model_config, redis_url, monkeypatch):
    images = [image_hash(f"queued-{i}.png") for i in range(4)]
    _store_in_redis(model_config, redis_url, images)
    extra = _extra(redis_url, max_inflight_items=1)
    engine = _engine(model_config, "ec_both", extra, monkeypatch)
    try:
        first = engine.add_request([images[0]])
        requests = [first] + [engine.add_request([image]) for image in images[1:]]
        requests.append(engine.add_request([images[2]]))  # shares a prefetch
        engine.run_until_finished(requests)
        orders = [identifier for step in engine.stage_orders for identifier in step]
        assert orders == images  # one prefetch per image, in arrival order
        assert engine.inflight_at_order and max(engine.inflight_at_order) <= 1
        assert engine.encoded == []
        for image in images:
            assert bit_equal(engine.gathered[image], encoder_output(image))
    finally:
        engine.shutdown()
