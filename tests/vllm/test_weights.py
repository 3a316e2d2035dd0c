"""Encoder weights change in place: never a stale tensor, through vLLM's real Scheduler.

The harness's encoder output is a function of the item and of the encoder
weights, and the connectors learn of a change the way vLLM's seams tell them
(``Worker.load_model``, the runners' ``reset_encoder_cache``).
"""

from __future__ import annotations

import logging
import os
import types

import numpy as np
import pytest
import torch

from lmcache_ec.integration.vllm import weights as weights_module
from lmcache_ec.integration.vllm.weights import weights_fingerprint
from tests.conftest import bit_equal

from .harness import Engine, TinyVLM, encoder_output, image_hash, make_vllm_config

W1, W2 = 1, 2
HALF = 12  # an encoder whose weight transfer is half done


def _engine(model_config, extra, weights_seed: int, role: str = "ec_both") -> Engine:
    engine = Engine(make_vllm_config(model_config, role, extra), runner="v1")
    if weights_seed != engine.weights_seed:
        engine.update_weights(weights_seed)
    return engine


def _serve(engine: Engine, image: str) -> None:
    engine.run_until_finished([engine.add_request([image])])


def _store(model_config, extra, image: str, weights_seed: int) -> None:
    """An instance on ``weights_seed`` encodes ``image`` and saves it."""
    writer = _engine(model_config, extra, weights_seed)
    try:
        _serve(writer, image)
        writer.flush()
    finally:
        writer.shutdown()


def _read(model_config, extra, image: str, weights_seed: int) -> bool:
    """A fresh instance on ``weights_seed`` serves ``image``: True if it loaded it.

    Whatever it did, the output is the one of its own weights, bit for bit.
    """
    reader = _engine(model_config, extra, weights_seed)
    try:
        _serve(reader, image)
        assert bit_equal(reader.gathered[image], encoder_output(image, weights_seed))
        return reader.encoded == []
    finally:
        reader.shutdown()


def test_the_weights_matter():
    image = image_hash("cat.png")
    assert not bit_equal(encoder_output(image, W1), encoder_output(image, W2))
    assert weights_fingerprint(TinyVLM(W1)) != weights_fingerprint(TinyVLM(W2))


def test_weight_update_re_encodes_and_old_weights_keep_their_entries(model_config, extra):
    image = image_hash("cat.png")
    first = _engine(model_config, extra, W1)
    try:
        _serve(first, image)  # computed and saved under W1
        assert first.encoded == [image]
        first.flush()

        first.update_weights(W2)  # in place, e.g. reload_weights after an RL step
        _serve(first, image)
        assert first.encoded == [image, image]  # encoded again, not loaded
        assert bit_equal(first.gathered[image], encoder_output(image, W2))
        first.flush()
    finally:
        first.shutdown()
    entries = [name for name in os.listdir(extra["lmcache_config"]["local_disk"])]
    assert len(entries) == 2  # one per weights version

    for weights in (W1, W2):  # each instance loads its own weights' output, bit-exact
        assert _read(model_config, extra, image, weights)


def test_staged_items_never_cross_an_update(model_config, extra):
    """An item staged under W1 for a deferred request is computed under W2 instead."""
    image = image_hash("dog.png")
    _store(model_config, extra, image, W1)

    # No wait inside a busy step: the request is deferred while its item stages.
    engine = _engine(model_config, {**extra, "busy_stage_wait_s": 0.0}, W1)
    try:
        busy = engine.add_request([], max_tokens=50)
        engine.step()
        request = engine.add_request([image])
        engine.step()  # the stage order goes out; the request is deferred
        assert request not in engine.scheduled[-1]
        deadline = 100
        while not engine.workers[0].worker.staged.current and deadline:  # staged under W1
            engine.step()
            deadline -= 1
        changes = engine.ec_stats.get("scheduler_weights_changes", 0)
        engine.update_weights(W2)
        engine.run_until_finished([request, busy])
        assert engine.encoded == [image]  # computed under W2 ...
        assert bit_equal(engine.gathered[image], encoder_output(image, W2))  # ... never W1's
        assert engine.ec_stats["scheduler_weights_changes"] == changes + 1
        assert engine.ec_stats.get("load_direct_reads", 0) == 0
    finally:
        engine.shutdown()


def test_saves_queued_before_an_update_keep_their_weights(model_config, extra):
    image = image_hash("bird.png")
    engine = _engine(model_config, extra, W1)
    try:
        _serve(engine, image)
        engine.update_weights(W2)  # possibly before the W1 save reached the disk
        engine.flush()
    finally:
        engine.shutdown()
    assert _read(model_config, extra, image, W1)  # the W1 output, under W1's key
    assert not _read(model_config, extra, image, W2)


class _TransferBackend:
    """What vLLM's ``Worker`` weight-transfer methods call on its transfer backend
    (NCCL, IPC…); the chunks themselves are written into the model by the test."""

    supports_draft_weight_update = True

    def __init__(self) -> None:
        self.target: torch.nn.Module | None = None

    def start_weight_update(self) -> None:
        pass

    def finish_weight_update(self) -> None:
        pass

    def set_weight_update_target(self, model, model_config) -> None:
        self.target = model

    def reset_weight_update_target(self) -> None:
        self.target = None


def _vllm_worker(engine: Engine, monkeypatch, draft: torch.nn.Module | None = None):
    """vLLM's own ``Worker`` (its weight-transfer methods, as weight_updates.py wraps them)
    over the harness's model; rank 0's connector is this process's EC transfer agent."""
    from vllm.distributed.ec_transfer import ec_transfer_state
    from vllm.v1.worker.gpu_worker import Worker

    monkeypatch.setattr(ec_transfer_state, "_EC_CONNECTOR_AGENT", engine.workers[0])
    worker = object.__new__(Worker)  # no device, no model loading: the state these use
    worker.vllm_config = engine.vllm_config
    worker.speculative_config = (
        types.SimpleNamespace(draft_model_config=object()) if draft is not None else None
    )
    worker.weight_transfer_engine = _TransferBackend()
    worker._weight_update_active = False
    worker._weight_update_is_draft = False
    worker.model_runner = types.SimpleNamespace(
        get_model=lambda: engine.model, get_draft_model=lambda: draft, reset_lora_state=lambda: None
    )
    return worker


def _load_vision_tower(engine: Engine, weights_seed: int) -> None:
    """Chunks of a weight transfer reach the encoder (no reset_encoder_cache follows)."""
    engine.weights_seed = weights_seed
    with torch.no_grad():
        engine.model.vision_tower.load_state_dict(TinyVLM(weights_seed).vision_tower.state_dict())


def test_nothing_is_saved_or_loaded_while_a_weight_transfer_replaces_the_encoder(
    model_config, extra, monkeypatch
):
    """Between start_weight_update and finish_weight_update the encoder is partly
    replaced: its outputs are keyed by no weights, and no stored output is loaded."""
    from vllm.v1.worker.gpu_worker import Worker

    stored, during = image_hash("stored.png"), image_hash("during.png")
    _store(model_config, extra, stored, W1)
    engine = _engine(model_config, extra, W1)
    try:
        worker = _vllm_worker(engine, monkeypatch)
        Worker.start_weight_update(worker)
        _load_vision_tower(engine, HALF)
        _serve(engine, stored)
        _serve(engine, during)
        assert engine.encoded == [stored, during]  # nothing loaded mid-transfer
        assert bit_equal(engine.gathered[stored], encoder_output(stored, HALF))
        assert engine.ec_stats.get("saves_skipped_weights_unknown", 0) == 2
        _load_vision_tower(engine, W2)
        Worker.finish_weight_update(worker)  # fingerprinted: W2's key from now on
        after = image_hash("after.png")
        _serve(engine, after)
        engine.flush()
    finally:
        engine.shutdown()
    assert not _read(model_config, extra, during, W1)  # never under the old key ...
    assert not _read(model_config, extra, during, HALF)  # ... nor any other
    assert _read(model_config, extra, stored, W1)  # W1's entries are untouched
    assert _read(model_config, extra, after, W2)


def test_a_draft_model_transfer_keeps_the_encoders_key_and_its_loads(
    model_config, extra, monkeypatch
):
    """start_draft_weight_update writes the draft model, which shares only the
    target's language-model modules (vLLM's proposers share its head and embeddings):
    the encoder's outputs stay valid, so loads go on during and after the session."""
    from vllm.v1.worker.gpu_worker import Worker

    during, after = image_hash("draft-during.png"), image_hash("draft-after.png")
    for image in (during, after):
        _store(model_config, extra, image, W1)
    engine = _engine(model_config, extra, W1)
    try:
        draft = torch.nn.Module()
        draft.layer = torch.nn.Linear(8, 8)
        draft.lm_head = engine.model.language_model  # shared with the target
        worker = _vllm_worker(engine, monkeypatch, draft)
        key = engine.workers[0].worker.weights
        Worker.start_draft_weight_update(worker)
        assert worker.weight_transfer_engine.target is draft
        with torch.no_grad():
            for parameter in draft.parameters():  # the draft's chunks, shared head included
                parameter.add_(1.0)
        _serve(engine, during)
        Worker.finish_weight_update(worker)  # fingerprinted again: the same encoder
        _serve(engine, after)
        assert engine.encoded == []  # both loaded from the tiers
        assert [image for step in engine.loads for image in step] == [during, after]
        assert engine.workers[0].worker.weights == key
        assert engine.connector.scheduler.weights == key
        assert engine.ec_stats["scheduler_weights_changes"] == 1  # W1's, at start-up
        for image in (during, after):
            assert bit_equal(engine.gathered[image], encoder_output(image, W1))
    finally:
        engine.shutdown()


def test_without_a_fingerprint_nothing_is_saved_or_loaded(model_config, extra):
    """Until the worker has fingerprinted the weights no key can be trusted."""
    image = image_hash("unknown.png")
    _store(model_config, extra, image, W1)
    config = make_vllm_config(model_config, "ec_both", extra)
    engine = Engine(config, runner="v1", announce_weights=False)  # the seam never fired
    try:
        _serve(engine, image)
        assert engine.encoded == [image]  # not loaded
        assert engine.ec_stats.get("saves_skipped_weights_unknown", 0) == 1
    finally:
        engine.shutdown()


def test_fingerprint_sees_the_encoder_only():
    model = TinyVLM(W1)
    before = weights_fingerprint(model)
    assert weights_fingerprint(TinyVLM(W1)) == before  # same weights, another load
    with torch.no_grad():
        model.language_model.weight.add_(1.0)
    assert weights_fingerprint(model) == before  # the language model is not the encoder
    with torch.no_grad():
        model.vision_tower.weight[3, 5] += 1e-3
    assert weights_fingerprint(model) != before  # one value of the tower changed
    with torch.no_grad():
        model.vision_tower.weight[3, 5] -= 1e-3
        flat = model.vision_tower.weight.view(-1)
        flat[[0, 1]] = flat[[1, 0]]  # same values, other places
    assert weights_fingerprint(model) != before


def test_fingerprint_gathers_over_tensor_parallel_ranks():
    model = TinyVLM(W1)
    shards = []

    def gather(local: torch.Tensor) -> torch.Tensor:
        shards.append(local)
        return torch.cat([local, torch.zeros_like(local)])  # another rank's digest

    assert weights_fingerprint(model, gather) != weights_fingerprint(model)
    assert len(shards) == 1 and shards[0].dtype == torch.int64


def _old_sums(bits: torch.Tensor) -> tuple[int, int]:
    """Plain and position-weighted sums of raw bits (weights 1..65521): the
    device digest these tests replace, kept to show their changes cancel it."""
    values = bits.to(torch.int64)
    weights = torch.arange(values.numel()) % 65521 + 1
    return int(values.sum()), int((values * weights).sum())


def _weights(elements: int, seed: int) -> torch.Tensor:
    return torch.randn(elements, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


# In a whole chunk (summed a group of chunks at a time) and in a tensor's tail.
PLACES = (100, "tail")


def test_mixed_sum_sees_a_plus_one_minus_two_plus_one_on_neighbours():
    from lmcache_ec.integration.vllm.weights import MIX_CHUNK, mixed_sum

    weights = _weights(MIX_CHUNK + 4096, seed=1)
    for place in PLACES:
        at = MIX_CHUNK + 100 if place == "tail" else place
        changed = weights.clone()
        bits = changed.view(torch.int16)
        bits[at : at + 3] += torch.tensor([1, -2, 1], dtype=torch.int16)
        assert _old_sums(bits) == _old_sums(weights.view(torch.int16))  # a structured collision
        assert int(mixed_sum(changed)) != int(mixed_sum(weights)), place


def test_mixed_sum_sees_two_values_swapped_65521_apart():
    from lmcache_ec.integration.vllm.weights import MIX_CHUNK, mixed_sum

    weights = _weights(MIX_CHUNK + 70_000, seed=2)
    for place in PLACES:
        at = MIX_CHUNK + 10 if place == "tail" else place
        swapped = weights.clone()
        swapped[[at, at + 65521]] = swapped[[at + 65521, at]]
        assert not torch.equal(swapped, weights)
        assert _old_sums(swapped.view(torch.int16)) == _old_sums(weights.view(torch.int16))
        assert int(mixed_sum(swapped)) != int(mixed_sum(weights)), place


def test_mixed_sum_sees_chunks_trade_places_and_single_changes():
    from lmcache_ec.integration.vllm.weights import MIX_CHUNK, mixed_sum

    weights = torch.randint(-(2**15), 2**15, (2 * MIX_CHUNK,), dtype=torch.int16)
    base = int(mixed_sum(weights))
    assert int(mixed_sum(weights.clone())) == base
    halves = torch.cat([weights[MIX_CHUNK:], weights[:MIX_CHUNK]])
    assert int(mixed_sum(halves)) != base
    changed = weights.clone()
    changed[MIX_CHUNK + 7] += 1
    assert int(mixed_sum(changed)) != base


def test_mixed_sum_is_exact_arithmetic_modulo_2_64():
    """The value any device must give (a GPU check compares a CUDA tensor's
    ``mixed_sum`` with this): each element's bits times its position's odd
    multiplier, each chunk's sum times its own odd key, wrapping at 2**64."""
    from lmcache_ec.integration.vllm.weights import MIX_CHUNK, _splitmix64, mixed_sum

    values = torch.randint(-(2**15), 2**15, (2 * MIX_CHUNK + 12_345,), dtype=torch.int16)
    expected = 0
    with np.errstate(over="ignore"):
        table = _splitmix64(np.arange(MIX_CHUNK, dtype=np.uint64)) | np.uint64(1)
        for index, start in enumerate(range(0, values.numel(), MIX_CHUNK)):
            chunk = values[start : start + MIX_CHUNK].numpy().astype(np.int64).view(np.uint64)
            chunk_sum = int(np.sum(chunk * table[: chunk.size], dtype=np.uint64))
            key = int(_splitmix64(np.array([MIX_CHUNK + index], dtype=np.uint64))[0]) | 1
            expected = (expected + chunk_sum * key) % 2**64
    assert int(mixed_sum(values)) % 2**64 == expected
    assert int(mixed_sum(values.view(torch.float16))) == int(mixed_sum(values))  # raw bits


class BufferedVLM(TinyVLM):
    """TinyVLM with a buffer in each part (a vision tower's position ids, a
    language model's rotary table)."""

    def __init__(self, weights_seed: int) -> None:
        super().__init__(weights_seed)
        self.vision_tower.register_buffer("positions", torch.arange(16, dtype=torch.float32))
        self.language_model.register_buffer("rotary", torch.ones(16))


def test_vision_buffers_count_and_language_model_buffers_do_not():
    model = BufferedVLM(W1)
    before = weights_fingerprint(model)
    model.language_model.rotary[3] = 2.0
    assert weights_fingerprint(model) == before
    model.vision_tower.positions[3] = 42.0
    assert weights_fingerprint(model) != before


def test_a_weight_reinterpreted_as_another_16_bit_dtype_changes_the_fingerprint():
    model = TinyVLM(W1).to(torch.bfloat16)
    before = weights_fingerprint(model)
    tower = model.vision_tower
    tower.weight = torch.nn.Parameter(tower.weight.detach().view(torch.float16))  # same bits
    assert weights_fingerprint(model) != before


class _HFVisionModel(torch.nn.Module):
    """What transformers builds under vLLM's Transformers backend."""

    def __init__(self) -> None:
        super().__init__()
        self.vision_tower = torch.nn.Linear(4, 4)
        self.multi_modal_projector = torch.nn.Linear(4, 4)
        self.language_model = torch.nn.Linear(4, 4)


def _transformers_backend_model() -> torch.nn.Module:
    """A model built the way vLLM's Transformers backend composes its classes,
    with vLLM's own ``MultiModalMixin`` (its ``get_language_model()`` returns a
    wrapper sharing the whole model's ``_modules``, vision tower included)."""
    from vllm.model_executor.models.transformers.multimodal import MultiModalMixin

    class Base(torch.nn.Module):  # stands for vLLM's transformers.base.Base
        def __init__(self) -> None:
            super().__init__()
            self.model = _HFVisionModel()
            self.lm_head = torch.nn.Linear(4, 4)

    Base.__module__ = "vllm.model_executor.models.transformers.base"

    class MultiModalForCausalLM(MultiModalMixin, Base):
        def __init__(self) -> None:
            Base.__init__(self)  # MultiModalMixin.__init__ needs a whole VllmConfig

    MultiModalForCausalLM.__module__ = "vllm.model_executor.models.transformers.multimodal"
    return MultiModalForCausalLM()


def test_a_vision_update_under_the_transformers_backend_changes_the_fingerprint():
    model = _transformers_backend_model()
    assert len(list(model.get_language_model().parameters())) == len(list(model.parameters()))
    before = weights_fingerprint(model)
    with torch.no_grad():
        model.model.vision_tower.weight.add_(1.0)  # an RL step updates the vision tower
    after = weights_fingerprint(model)
    assert after != before
    with torch.no_grad():
        model.model.language_model.weight.add_(1.0)  # get_mm_mapping() names it: left out
    assert weights_fingerprint(model) == after


class _SelfLanguageVLM(TinyVLM):
    """A model whose language model is the whole model, with no ``get_mm_mapping()``."""

    def get_language_model(self) -> torch.nn.Module:
        return self


def test_a_language_model_holding_every_weight_fingerprints_them_all(caplog, monkeypatch):
    monkeypatch.setattr(weights_module, "_LOGGED", set())
    model = _SelfLanguageVLM(W1)
    with caplog.at_level(logging.ERROR, logger="lmcache_ec.integration.vllm.weights"):
        before = weights_fingerprint(model)
        with torch.no_grad():
            model.vision_tower.weight.add_(1.0)
        assert weights_fingerprint(model) != before
    # One error line, not one at every weight update.
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


class _LanguageModel(torch.nn.Module):
    """A language model with an input embedding table and an output head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(16, 8)
        self.layer = torch.nn.Linear(8, 8)


def _vlm_named(class_name: str, **attributes) -> torch.nn.Module:
    """A TinyVLM whose class carries ``class_name`` (the name vLLM's model class has)."""
    cls = type(class_name, (TinyVLM,), dict(attributes))
    model = cls(W1)
    model.language_model = _LanguageModel()
    return model


@pytest.mark.parametrize(
    ("class_name", "attributes"),
    [
        ("Molmo2ForConditionalGeneration", {}),
        ("Moondream3ForCausalLM", {}),
        ("NemotronH_Nano_VL_V2", {}),
        ("Qwen3VLForConditionalGeneration", {"is_multimodal_pruning_enabled": True}),
    ],
)
def test_a_language_embedding_update_changes_the_fingerprint_where_outputs_hold_its_rows(
    class_name, attributes
):
    model = _vlm_named(class_name, **attributes)
    before = weights_fingerprint(model)
    with torch.no_grad():
        model.language_model.layer.weight.add_(1.0)
    assert weights_fingerprint(model) == before  # the rest of the language model is not
    with torch.no_grad():
        model.language_model.embed_tokens.weight[3, 5] += 1e-3
    assert weights_fingerprint(model) != before


def test_a_subclass_inherits_the_rule_and_other_models_skip_the_language_embeddings():
    pruned = _vlm_named("Qwen3VLForConditionalGeneration", is_multimodal_pruning_enabled=True)
    moe = type("Qwen3VLMoeForConditionalGeneration", (type(pruned),), {})(W1)
    moe.language_model = _LanguageModel()
    for model, counted in (
        (moe, True),
        (_vlm_named("Qwen3VLForConditionalGeneration", is_multimodal_pruning_enabled=False), False),
        (_vlm_named("Blip2ForConditionalGeneration"), False),
    ):
        before = weights_fingerprint(model)
        with torch.no_grad():
            model.language_model.embed_tokens.weight[3, 5] += 1e-3
        assert (weights_fingerprint(model) != before) is counted, type(model).__name__
