"""An ``ec_consumer`` never holds an item off the tiers: a fetch given up
(its request aborted while the read was slow) is fetched again by the next
request (docs/vllm.md, ``failed_retry_s``: ``ec_both`` only)."""

from __future__ import annotations

import time

from vllm.v1.request import RequestStatus

from tests.vllm.harness import Engine, image_hash, make_vllm_config, stored_by_a_producer


def test_a_fetch_given_up_after_its_request_ended_is_fetched_by_the_next(model_config, extra):
    image = image_hash("slow-then-aborted.png")
    stored_by_a_producer(model_config, extra, [image])

    consumer_extra = {**extra, "stage_timeout_s": 0.3, "idle_stage_wait_s": 0.0}
    engine = Engine(make_vllm_config(model_config, "ec_consumer", consumer_extra))
    cache = engine.workers[0].worker.cache
    get_many = cache.get_many

    def slow_get_many(*args, **kwargs):
        time.sleep(0.8)  # a read slower than stage_timeout_s
        return get_many(*args, **kwargs)

    try:
        engine.run_until_finished([engine.add_request([image_hash("warm.png")])])
        cache.get_many = slow_get_many
        aborted = engine.add_request([image])
        engine.step()
        engine.scheduler.finish_requests(aborted, RequestStatus.FINISHED_ABORTED)
        deadline = time.monotonic() + 1.5  # past the read and the stage timeout
        while time.monotonic() < deadline:
            engine.step()
        cache.get_many = get_many
        engine.encoded.clear()
        engine.run_until_finished([engine.add_request([image])])
        assert engine.encoded == []
        assert image in [item for step in engine.loads for item in step]
    finally:
        engine.shutdown()
