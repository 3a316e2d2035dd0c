"""``max_staged_mb`` holds on both sides without failing a request for it.

- A load frees its room in flight once the step carrying it ran: freed when
  the load is scheduled, the next staging, ordered in the same ``schedule()``,
  met the worker's memory still holding the loaded copy and was refused (an
  ``ec_consumer`` failed its request).
- With async scheduling the next orders come while the step that loads the
  last copies still runs: a read copy waits (bounded) for those loads to free
  the worker's memory rather than being refused.
- A staging that fails on an ``ec_consumer`` fails its request once: it is not
  ordered again in a loop within the step.
"""

from __future__ import annotations

import logging
import time

import pytest

from tests.vllm.harness import (
    Engine,
    encoder_output,
    image_hash,
    make_vllm_config,
    stored_by_a_producer,
)


def _copy_bytes(image: str) -> int:
    tensor = encoder_output(image)
    return tensor.numel() * tensor.element_size()


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_requests_beyond_the_staged_memory_bound_load_in_turn_and_never_fail(
    model_config, extra, runner
):
    images = [image_hash(f"bound-{runner}-{n}.png") for n in range(4)]
    stored_by_a_producer(model_config, extra, images)
    two_copies = {**extra, "max_staged_mb": 2 * _copy_bytes(images[0]) / 2**20}
    engine = Engine(make_vllm_config(model_config, "ec_consumer", two_copies), runner=runner)
    try:
        engine.step()  # the scheduler learns the encoder weights
        requests = [engine.add_request([image]) for image in images]
        engine.run_until_finished(requests, max_steps=400)
        assert [engine.finished[r] for r in requests] == ["length"] * 4
        assert sorted(item for step in engine.loads for item in step) == sorted(images)
        # Never ordered while the step that frees its room had not run yet.
        assert engine.ec_stats.get("stage_room_waits", 0) == 0
    finally:
        engine.shutdown()


def test_a_read_copy_waits_for_a_running_steps_load_to_free_worker_memory(model_config, extra):
    first, second = image_hash("room-first.png"), image_hash("room-second.png")
    stored_by_a_producer(model_config, extra, [first, second])
    one_copy = {**extra, "max_staged_mb": _copy_bytes(first) / 2**20}
    engine = Engine(make_vllm_config(model_config, "ec_both", one_copy))
    worker = engine.workers[0].worker
    answers: list[tuple[list[str], list[str]]] = []

    class Link:  # the stage channel's link, as the worker answers on it
        def answer(self, staged: list[str], failed: list[str], weights: str) -> None:
            answers.append((staged, failed))

    try:
        worker.stage([first], worker.weights, Link())
        deadline = time.monotonic() + 10
        while not answers:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert answers == [([first], [])]
        worker.stage([second], worker.weights, Link())  # no room until ``first`` loads
        time.sleep(0.1)
        assert len(answers) == 1
        worker.release([first])  # what the running step's load does with it
        while len(answers) == 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert answers[1] == ([second], [])
    finally:
        engine.shutdown()


def test_a_staging_that_fails_on_a_consumer_is_read_once_and_logged_once(
    model_config, extra, caplog
):
    image = image_hash("listed-but-unreadable.png")
    stored_by_a_producer(model_config, extra, [image])
    engine = Engine(make_vllm_config(model_config, "ec_consumer", extra))
    cache = engine.workers[0].worker.cache
    # The index lists it; the worker's read finds nothing (lost between the two).
    cache.get_many = lambda identifiers, *args, **kwargs: [None] * len(identifiers)
    try:
        engine.step()
        caplog.set_level(logging.WARNING, logger="lmcache_ec.integration.vllm.scheduler")
        request = engine.add_request([image])
        engine.run_until_finished([request], max_steps=50)
        assert engine.finished[request] == "error"
        assert engine.ec_stats.get("scheduler_unavailable_requests") == 1
        assert engine.ec_stats.get("scheduler_stage_orders") == 1
        fetch_warnings = [r for r in caplog.records if "could not be fetched" in r.getMessage()]
        assert len(fetch_warnings) == 1
    finally:
        engine.shutdown()
