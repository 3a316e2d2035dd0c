"""An encode claim is withdrawn when it has done its work, and the right one is.

A claim tells other instances "this one encodes the image: wait for its
output". It is withdrawn once the output reached the tiers the instances share
(not merely this worker's CPU tier: a third instance would then find neither
output nor claim and encode again), or after ``claim_wait_s`` if that write
hangs; and a weights change withdraws the claims made under the old weights,
by the names they were made under. Engines are vLLM's real Scheduler
(``harness.py``) sharing one disk tier, hence its claims directory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from lmcache_ec.claims import DirectoryClaims, claims_dir_for
from tests.conftest import bit_equal

from .harness import (
    Engine,
    encoder_output,
    held_until_gate,
    hold_puts,
    image_hash,
    make_vllm_config,
    step_until,
)


def _free_within(claims: DirectoryClaims, name: str, engine: Engine, steps: int = 400) -> bool:
    """Whether another owner can claim ``name`` within ``steps`` steps of ``engine``."""
    for _ in range(steps):
        if claims.claim(name, 60.0):
            return True
        engine.step()
    return False


def _gate_disk_writes(engine: Engine) -> threading.Event:
    """``engine``'s disk writes wait until the returned gate opens (a slow upload)."""
    return held_until_gate(engine.workers[0].worker.cache._storage.disk, "write_entry")


def _in_cpu_tier(engine: Engine, image: str) -> Callable[[], bool]:
    return lambda: engine.workers[0].worker.cache.contains(image) is not None


def test_a_claim_holds_until_the_output_reached_the_shared_tier(model_config, extra):
    image = image_hash("uploading-slowly.png")
    first = Engine(make_vllm_config(model_config, "ec_both", {**extra, "claim_wait_s": 60.0}))
    second = Engine(make_vllm_config(model_config, "ec_both", {**extra, "claim_wait_s": 60.0}))
    gate = _gate_disk_writes(first)
    try:
        request_1 = first.add_request([image])
        step_until(first, _in_cpu_tier(first, image))  # saved in the CPU tier only
        for _ in range(5):  # the workers' step reports reach the scheduler
            first.step()
        request_2 = second.add_request([image])
        for _ in range(5):
            second.step()
        assert second.encoded == []  # the claim still stands: it waits for the output
        gate.set()
        second.run_until_finished([request_2])
        first.run_until_finished([request_1])
        assert first.encoded + second.encoded == [image]  # the encoder ran once
        assert bit_equal(second.gathered[image], encoder_output(image))
        assert second.ec_stats["scheduler_claims_lost"] == 1
        assert second.ec_stats["loads"] == 1
    finally:
        gate.set()
        first.shutdown()
        second.shutdown()


def test_a_save_whose_shared_write_hangs_is_reported_after_claim_wait_s(model_config, extra):
    image = image_hash("upload-hangs.png")
    engine = Engine(make_vllm_config(model_config, "ec_both", {**extra, "claim_wait_s": 0.2}))
    gate = _gate_disk_writes(engine)
    index = engine.connector.scheduler.index
    try:
        engine.add_request([image])
        step_until(engine, _in_cpu_tier(engine, image))
        # Still unwritten below (the gate is shut), yet reported: the claim has
        # expired by then, and the scheduler learns the worker holds the output.
        step_until(engine, lambda: index.lookup(image) == "worker")
    finally:
        gate.set()
        engine.shutdown()


def test_a_weights_change_withdraws_the_claims_made_under_the_old_weights(
    model_config, extra, disk_dir
):
    image = image_hash("claimed-before-an-rl-update.png")
    engine = Engine(make_vllm_config(model_config, "ec_both", {**extra, "claim_wait_s": 60.0}))
    # The save never completes: only the weights change can withdraw the claim.
    gate = hold_puts(engine)
    try:
        engine.step()  # the scheduler learns the encoder weights, part of the name
        old_name = engine.connector.scheduler.index.storage_name(image)
        engine.add_request([image])
        step_until(engine, lambda: engine.encoded == [image])
        other = DirectoryClaims(claims_dir_for(str(disk_dir)))
        assert not other.claim(old_name, 60.0)  # held by the engine, encoding it
        old_weights = engine.connector.scheduler.weights
        engine.update_weights(1)
        step_until(engine, lambda: engine.connector.scheduler.weights != old_weights)
        # An instance still on the old weights need not wait for an output
        # that will never come from here.
        assert _free_within(other, old_name, engine)
    finally:
        gate.set()
        engine.shutdown()
