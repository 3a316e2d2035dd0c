"""Two engine instances sharing only the disk tier, through vLLM's real Scheduler."""

from __future__ import annotations

import pytest

from tests.conftest import bit_equal

from .harness import Engine, encoder_output, image_hash, make_vllm_config


@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_second_instance_loads_instead_of_encoding(model_config, extra, runner, monkeypatch):
    image = image_hash("cat.png")
    configs = [make_vllm_config(model_config, "ec_both", extra) for _ in range(2)]
    # VllmConfig refuses V2 without Triton; the connector only reads the flag.
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if runner == "v2" else "0")
    first = Engine(configs[0], runner=runner)
    try:
        request = first.add_request([image])
        first.run_until_finished([request])
        assert first.encoded == [image]  # request 1 misses: the encoder runs
        first.flush()
    finally:
        first.shutdown()

    second = Engine(configs[1], runner=runner)
    try:
        if runner == "v1":
            # V1 runs connector hooks only in steps with tokens: keep it busy.
            busy = second.add_request([], max_tokens=200)
            second.step()
        request = second.add_request([image])
        second.run_until_finished([request])
        assert second.encoded == []  # no encoder work scheduled for the image
        assert bit_equal(second.gathered[image], encoder_output(image))
        # Stats reach vLLM's SchedulerStats (worker counters ride the worker meta).
        assert second.ec_stats["hits_disk"] == 1
        assert second.ec_stats["loads"] == 1
        assert second.ec_stats["bytes_out"] == encoder_output(image).numel() * 2
        if runner == "v1":
            second.run_until_finished([busy])
    finally:
        second.shutdown()

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    other = Engine(make_vllm_config(model_config, "ec_both", {**extra, "model": "other/model"}))
    try:
        request = other.add_request([image])
        other.run_until_finished([request])
        assert other.encoded == [image]  # another model's entries never match
    finally:
        other.shutdown()
