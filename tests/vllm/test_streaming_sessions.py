"""A streaming-input session (vLLM appends each chunk's media to the same
request) loads the items of later chunks from the tiers like the first's."""

from __future__ import annotations

from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request

from tests.vllm.harness import (
    IMAGE_TOKEN,
    NUM_EMBEDS,
    Engine,
    image_hash,
    make_vllm_config,
    stored_by_a_producer,
)


def _chunk(identifier: str) -> Request:
    feature = MultiModalFeatureSpec(
        data=None,
        modality="image",
        identifier=identifier,
        mm_position=PlaceholderRange(offset=0, length=NUM_EMBEDS),
        mm_hash=identifier,
    )
    return Request(
        request_id="session",
        prompt_token_ids=[IMAGE_TOKEN] * NUM_EMBEDS + [5, 5],
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        mm_features=[feature],
        resumable=True,
    )


def test_an_item_of_a_later_chunk_is_loaded_not_encoded(model_config, extra):
    first, second = image_hash("chunk-1.png"), image_hash("chunk-2.png")
    stored_by_a_producer(model_config, extra, [first, second])

    engine = Engine(make_vllm_config(model_config, "ec_consumer", extra))
    try:
        engine.scheduler.add_request(_chunk(first))
        for _ in range(6):
            engine.step()
        session = engine.scheduler.requests["session"]
        engine.scheduler.add_request(_chunk(second))  # the next chunk: vLLM appends its media
        engine.features["session"] = session.mm_features
        for _ in range(6):
            engine.step()
        assert [f.identifier for f in session.mm_features] == [first, second]
        loaded = [item for step in engine.loads for item in step]
        assert loaded == [first, second]
        assert engine.encoded == []
    finally:
        engine.shutdown()
