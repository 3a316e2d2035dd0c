"""One encode per image across instances: claims in a store the instances share.

Two engine instances (vLLM's real Scheduler, the harness's counted encoder)
share a disk tier, hence its claims directory, or only a Redis remote tier
(each its own disk), whose store then holds the claims.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import bit_equal

from .harness import (
    Engine,
    claimed_by_a_dead_process,
    encoder_output,
    hold_puts,
    image_hash,
    make_vllm_config,
    step_until,
)


@pytest.fixture(params=["shared disk", "redis"])
def two_instances(request, extra, tmp_path) -> tuple[dict, dict]:
    """The two instances' connector configs: one disk directory, or one Redis."""
    if request.param == "shared disk":
        return extra, extra
    redis_url = request.getfixturevalue("redis_url")
    configs = []
    for name in ("first", "second"):
        disk = tmp_path / f"{name}-disk"
        disk.mkdir()
        ec = {**extra["lmcache_config"], "local_disk": str(disk), "remote_url": redis_url}
        configs.append({**extra, "lmcache_config": ec})
    return configs[0], configs[1]


def test_an_image_reaching_two_instances_is_encoded_once(model_config, two_instances):
    image = image_hash("new-and-shared.png")
    # A wait bound no loaded machine reaches: the output lands first.
    first_extra, second_extra = ({**e, "claim_wait_s": 60.0} for e in two_instances)
    first = Engine(make_vllm_config(model_config, "ec_both", first_extra))
    second = Engine(make_vllm_config(model_config, "ec_both", second_extra))
    # The first instance's output lands only when the gate opens: the image
    # reaches the second instance while the first still "encodes" it.
    gate = hold_puts(first)
    try:
        request_1 = first.add_request([image])
        step_until(first, lambda: first.encoded)
        request_2 = second.add_request([image])
        for _ in range(5):
            second.step()
        assert second.encoded == []  # it waits for the first instance's output
        assert not any(request_2 in scheduled for scheduled in second.scheduled)
        gate.set()
        second.run_until_finished([request_2])
        first.run_until_finished([request_1])
        assert first.encoded + second.encoded == [image]  # the encoder ran once
        assert bit_equal(first.gathered[image], encoder_output(image))
        assert bit_equal(second.gathered[image], first.gathered[image])
        assert second.ec_stats["scheduler_claims_lost"] == 1
        assert second.ec_stats["loads"] == 1
    finally:
        gate.set()
        first.shutdown()
        second.shutdown()


def _request_for_an_image_a_dead_process_claimed(engine: Engine, image: str, disk_dir) -> Any:
    """A process claims ``image`` and dies; then a request for it takes one step."""
    engine.step()  # the scheduler learns the encoder weights, part of the name
    claimed_by_a_dead_process(engine, image, disk_dir)
    request = engine.add_request([image])
    engine.step()
    return request


def test_a_dead_claim_holder_delays_the_image_at_most_the_bound(model_config, extra, disk_dir):
    image = image_hash("claimed-by-a-dead-process.png")
    engine = Engine(make_vllm_config(model_config, "ec_both", {**extra, "claim_wait_s": 0.2}))
    try:
        request = _request_for_an_image_a_dead_process_claimed(engine, image, disk_dir)
        assert engine.encoded == []  # deferred: another instance claimed it
        engine.run_until_finished([request])
        assert engine.encoded == [image]  # after the bound, encoded here
        assert bit_equal(engine.gathered[image], encoder_output(image))
        assert engine.ec_stats["scheduler_claims_lost"] == 1
    finally:
        engine.shutdown()


def test_claims_can_be_turned_off(model_config, extra, disk_dir):
    image = image_hash("claimed-but-ignored.png")
    engine = Engine(make_vllm_config(model_config, "ec_both", {**extra, "claim_encodes": False}))
    try:
        request = _request_for_an_image_a_dead_process_claimed(engine, image, disk_dir)
        assert engine.encoded == [image]  # no waiting for anyone
        engine.run_until_finished([request])
    finally:
        engine.shutdown()
