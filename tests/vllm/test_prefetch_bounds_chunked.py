"""Requests needing more stored items than the prefetch bounds, under chunked prefill.

vLLM asks about a running request's items again at every step of its prefill.
A running request that was deferred again for its later items held the staged
copies of those it had, which take the room in flight, while waiting for room
only they could free: it never got another token (``ec_both``), or failed
(``ec_consumer``). Deferred requests that each held staged items while waiting
for room took turns for ever as those items' deadlines released them. Now a
running request waits on nothing new (what no one holds is computed), and a
staged item some deferred request still waits on is kept past its deadline:
each request waits at most its other items' deadlines.
"""

from __future__ import annotations

import random

import pytest

from tests.conftest import bit_equal
from tests.vllm.harness import (
    Engine,
    encoder_output,
    image_hash,
    make_vllm_config,
    stored_by_a_producer,
)

TOKENS_PER_STEP = 8  # two of the tiny BLIP-2's 4-token images a step


@pytest.mark.parametrize("role", ["ec_both", "ec_consumer"])
def test_a_running_request_with_more_stored_items_than_the_bounds_finishes(
    model_config, extra, role
):
    images = [image_hash(f"frame-{role}-{n}.png") for n in range(8)]
    stored_by_a_producer(model_config, extra, images)
    bounded = {**extra, "max_inflight_items": 4}
    config = make_vllm_config(model_config, role, bounded, max_num_batched_tokens=TOKENS_PER_STEP)
    engine = Engine(config)
    try:
        engine.step()  # the scheduler learns the encoder weights
        request = engine.add_request(images)
        engine.run_until_finished([request], max_steps=60)
        assert engine.finished[request] == "length"
        assert engine.ec_stats["loads"] == 4  # those within the bounds, loaded
        assert sorted(engine.encoded) == sorted(images[4:])  # the rest computed
        for image in images:
            assert bit_equal(engine.gathered[image], encoder_output(image))
    finally:
        engine.shutdown()


@pytest.mark.parametrize("role", ["ec_both", "ec_consumer"])
def test_requests_holding_staged_items_while_waiting_for_room_all_finish(model_config, extra, role):
    """Many-image requests sharing images, some stored, arriving while others run."""
    rng = random.Random(9)
    stored = [image_hash(f"mixed-stored-{n}.png") for n in range(30)]
    fresh = [image_hash(f"mixed-fresh-{n}.png") for n in range(30)]
    stored_by_a_producer(model_config, extra, stored)
    bounded = {**extra, "max_inflight_items": 6, "stage_timeout_s": 2.0}
    config = make_vllm_config(model_config, role, bounded, max_num_batched_tokens=12)
    engine = Engine(config)
    try:
        engine.step()
        requests = []
        for _ in range(60):
            if rng.random() < 0.15:
                count = rng.randint(10, 40)
                chosen = [rng.choice(stored if rng.random() < 0.6 else fresh) for _ in range(count)]
                if rng.random() < 0.5:  # an image twice in one request
                    chosen.insert(rng.randint(0, len(chosen)), chosen[0])
                requests.append(engine.add_request(chosen, max_tokens=rng.randint(1, 3)))
            engine.step()
        engine.run_until_finished(requests, max_steps=3000)
        assert [engine.finished[r] for r in requests] == ["length"] * len(requests)
        assert engine.ec_stats["loads"] > 0
        for image, tensor in engine.gathered.items():
            assert bit_equal(tensor, encoder_output(image))
    finally:
        engine.shutdown()
