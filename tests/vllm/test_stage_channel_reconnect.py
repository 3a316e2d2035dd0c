"""A stage channel that reconnects while the scheduler orders stagings.

The scheduler connects again to its workers inside ``WorkerLink.dispatch``
when the retry time comes mid-step; the worker's greeting may then announce
weights that changed while the channel was down, and that gives up every
fetch under the old ones. What the scheduler was about to order is computed
under the new weights, never staged (nor raised out of vLLM's ``schedule()``).
These tests run vLLM's real Scheduler with V1's call pattern.
"""

from __future__ import annotations

import time

from vllm.v1.request import RequestStatus

from lmcache_ec.integration.vllm.items import ItemState
from tests.conftest import bit_equal

from .harness import Engine, encoder_output, image_hash, make_vllm_config, stored_by_a_producer


def _links_become(engine: Engine, count: int) -> bool:
    listener = engine.workers[0]._listener
    deadline = time.monotonic() + 5.0
    while listener.links != count and time.monotonic() < deadline:
        time.sleep(0.01)
    return listener.links == count


def test_weights_heard_on_a_reconnect_mid_dispatch_compute_the_item_not_crash_the_step(
    model_config, extra
):
    image = image_hash("reconnect-in-dispatch.png")
    stored_by_a_producer(model_config, extra, [image])
    # The greeting is awaited within the step (the wait ends when it arrives).
    extra = {**extra, "idle_stage_wait_s": 5.0}
    engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner="v1")
    scheduler = engine.connector.scheduler
    channel = scheduler.channel
    try:
        engine.step()  # an empty step connects the channel
        assert channel.connected and _links_become(engine, 1)
        channel._break("gone", "a worker closed its end")  # retried RETRY_S from now
        assert _links_become(engine, 0)
        engine.update_weights(1)  # while no link hears the announcement
        # The image's lookup lasts until the retry time: dispatch reconnects.
        lookup = scheduler.index.lookup

        def lookup_until_the_retry_time(identifier):
            channel._retry_at = 0.0
            return lookup(identifier)

        scheduler.index.lookup = lookup_until_the_retry_time
        request = engine.add_request([image])
        engine.step()  # raised IllegalTransition (unknown -> staging)
        assert channel.connected
        assert scheduler.items.state(image) is not ItemState.STAGING
        engine.run_until_finished([request])
        assert engine.encoded == [image]  # under the new weights: computed
        assert bit_equal(engine.gathered[image], encoder_output(image, weights_seed=1))
        assert not any(image in orders for orders in engine.stage_orders)  # never staged
    finally:
        engine.shutdown()


def test_a_release_a_channel_break_kept_from_the_worker_still_frees_its_copy(model_config, extra):
    """A release still in the scheduler's outbox when the channel broke goes out
    again (in the step's metadata): the worker must not hold the copy for good."""
    image = image_hash("released-across-a-break.png")
    stored_by_a_producer(model_config, extra, [image])
    extra = {**extra, "idle_stage_wait_s": 0.0, "busy_stage_wait_s": 0.0, "stage_timeout_s": 0.3}
    engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner="v2")
    scheduler = engine.connector.scheduler
    channel = scheduler.channel
    worker = engine.workers[0].worker
    try:
        engine.step()  # an empty step connects the channel
        assert channel.connected and _links_become(engine, 1)
        request = engine.add_request([image])
        engine.step()  # orders the staging over the channel
        deadline = time.monotonic() + 5.0
        while not worker.staged_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.staged_bytes > 0
        for rank in channel._ranks:  # the worker's socket takes nothing more
            rank.outbox.write = lambda sock: None
        engine.scheduler.finish_requests(request, RequestStatus.FINISHED_ABORTED)
        # Past the staged copy's deadline (counted from when its answer came in,
        # late on a loaded machine): released unused, the release in the outbox.
        deadline = time.monotonic() + 10.0
        while scheduler.items.state(image) is not ItemState.UNKNOWN:
            assert time.monotonic() < deadline, scheduler.items.state(image)
            time.sleep(0.1)
            engine.step()
        channel._break("gone", "a worker closed its end")
        engine.run_until_finished([engine.add_request([])])  # metadata reaches the workers
        assert worker.staged_bytes == 0
    finally:
        engine.shutdown()
