"""An identifier whose request has another number of placeholders than its
stored output has rows (a client-provided multimodal UUID reused for other
content, as vLLM warns): never placed, since vLLM's merge would raise in the
forward pass and the engine die. vLLM's own encoder cache fails just that
request; the tiers do the same or encode it:

- a staged copy of other rows than its order's request is refused by the
  worker (``stage_wrong_rows``): the item is encoded (``ec_both``);
- a request with other rows than those an item is being fetched for fails
  (``rows_mismatch_requests``), the request it is fetched for loads it.

vLLM's real Scheduler, both model runners' call patterns.
"""

from __future__ import annotations

import pytest
from vllm.v1.request import RequestStatus

from lmcache_ec.integration.vllm.items import ItemState

from .harness import (
    NUM_EMBEDS,
    Engine,
    held_until_gate,
    image_hash,
    make_vllm_config,
    orders_in_step_metadata,
    step_until,
    stored_by_a_producer,
)

RUNNERS = ["v1", "v2"]


@pytest.mark.parametrize(
    ("runner", "orders"),
    [("v1", "stage_channel"), ("v2", "stage_channel"), ("v2", "step_metadata")],
)
def test_a_stored_output_of_other_rows_than_the_request_is_encoded_not_placed(
    model_config, extra, runner, orders
):
    image = image_hash(f"thumbnail-under-a-reused-uuid-{orders}.png")
    stored_by_a_producer(model_config, extra, [image])  # NUM_EMBEDS rows
    engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner=runner)
    try:
        if orders == "step_metadata":
            orders_in_step_metadata(engine)
        request = engine.add_request([image], num_embeds=2 * NUM_EMBEDS)
        engine.run_until_finished([request])
        assert engine.finished[request] == "length"
        assert not any(image in loads for loads in engine.loads)  # never placed
        assert engine.encoded == [image]
        assert engine.ec_stats["stage_wrong_rows"] == 1
    finally:
        engine.shutdown()


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_request_with_other_rows_than_an_item_is_fetched_for_fails_alone(
    model_config, extra, runner
):
    """Staged for a request since aborted: the next request for the item has
    other rows, so vLLM holds no record to compare it with (its own check
    compares with its encoder cache and this step's items)."""
    image = image_hash("two-sizes-one-uuid.png")
    stored_by_a_producer(model_config, extra, [image])
    engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner=runner)
    try:
        gate = held_until_gate(engine.workers[0].worker.cache, "get_many")
        aborted = engine.add_request([image])
        engine.step()  # its staging ordered, the read held
        engine.scheduler.finish_requests(aborted, RequestStatus.FINISHED_ABORTED)
        gate.set()
        scheduler = engine.connector.scheduler
        step_until(engine, lambda: scheduler.items.state(image) is ItemState.READY)
        other = engine.add_request([image], num_embeds=2 * NUM_EMBEDS)
        engine.run_until_finished([other])
        assert engine.finished[other] == "error"
        assert not any(image in loads for loads in engine.loads)
        assert engine.ec_stats["scheduler_rows_mismatch_requests"] == 1
        fits = engine.add_request([image])  # the item is still served at its rows
        engine.run_until_finished([fits])
        assert engine.finished[fits] == "length" and engine.encoded == []
    finally:
        engine.shutdown()
