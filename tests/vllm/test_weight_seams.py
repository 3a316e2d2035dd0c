"""Every way vLLM changes a worker's weights is seen, and none costs a wrong tensor or the engine.

vLLM's real ``Worker`` methods (``sleep``, ``wake_up``, ``execute_model``,
``reset_weights``, the weight-transfer session), as ``weight_updates.py``
wraps them, over the harness's model; vLLM's real Scheduler. Guaranteed:

- weights loaded between ``sleep`` and the next step, through no seam (the
  common RL loop), are fingerprinted at that step: nothing of the old
  weights is loaded into the new ones, nothing of the new saved under the
  old key; while asleep, no seam reads the weights;
- ``reset_weights`` (the ``/weight_checker`` reset) is a weight change;
- while the weights are unknown, nothing is read under the key of no weights;
- a load the scheduler promised before it heard of a change never misses
  (vLLM's model runner would raise); an item staged before a change the
  scheduler hears in time, or before an encoder cache reset, is never loaded
  after it;
- a fingerprint that fails on one tensor-parallel rank fails on all, and no
  rank waits in the gather;
- a save landed under the old weights is never reported under the new ones.
"""

from __future__ import annotations

import threading
import types

import pytest
import torch

from lmcache_ec.integration.vllm import connector as connector_module
from lmcache_ec.integration.vllm.items import ItemState
from lmcache_ec.integration.vllm.metadata import ECTierConnectorMetadata
from lmcache_ec.integration.vllm.weights import FingerprintError, weights_fingerprint
from tests.conftest import bit_equal

from .harness import (
    NUM_EMBEDS,
    Engine,
    TinyVLM,
    encoder_output,
    hold_puts,
    image_hash,
    make_vllm_config,
    step_until,
)

S = ItemState
W1, W2 = 1, 2
HALF = 12  # an encoder whose weight transfer is half done
OTHER = 5  # another deployment's weights
ZEROED = 99  # the encoder output after reset_weights
NO_TOKENS = types.SimpleNamespace(total_num_scheduled_tokens=0)  # a step's scheduler output


@pytest.fixture(autouse=True)
def _awake():
    """A test failing between a sleep and its step leaves no sleep to the next one."""
    from lmcache_ec.integration.vllm import weight_updates

    yield
    weight_updates._Slept.due = False


def _engine(model_config, extra, weights_seed: int, role: str = "ec_both", **kw) -> Engine:
    engine = Engine(make_vllm_config(model_config, role, extra), runner="v1", **kw)
    if weights_seed != engine.weights_seed:
        engine.update_weights(weights_seed)
    return engine


def _serve(engine: Engine, image: str) -> None:
    engine.run_until_finished([engine.add_request([image])])


def _store(model_config, extra, image: str, weights_seed: int, **options) -> None:
    """An instance on ``weights_seed`` encodes ``image`` and saves it."""
    writer = _engine(model_config, {**extra, **options}, weights_seed)
    try:
        _serve(writer, image)
        writer.flush()
    finally:
        writer.shutdown()


def _read(model_config, extra, image: str, weights_seed: int) -> bool:
    """A fresh instance on ``weights_seed`` serves ``image``: True if it loaded it.
    Whatever it did, the output is the one of its own weights, bit for bit."""
    reader = _engine(model_config, extra, weights_seed)
    try:
        _serve(reader, image)
        assert bit_equal(reader.gathered[image], encoder_output(image, weights_seed))
        return reader.encoded == []
    finally:
        reader.shutdown()


def _load_vision_tower(engine: Engine, weights_seed: int) -> None:
    """A weight sync through no seam (a ``collective_rpc`` of the user's own)."""
    engine.weights_seed = weights_seed
    with torch.no_grad():
        engine.model.vision_tower.load_state_dict(TinyVLM(weights_seed).vision_tower.state_dict())


class _TransferBackend:
    """What vLLM's weight-transfer methods call on their backend (the chunks are
    written into the model by the test)."""

    def start_weight_update(self) -> None:
        pass

    def finish_weight_update(self) -> None:
        pass

    def set_weight_update_target(self, model, model_config) -> None:
        pass

    def reset_weight_update_target(self) -> None:
        pass


class _SleepBackend:
    """vLLM's sleep-mode allocator backend: offloading is not what is tested."""

    def suspend(self, level: int) -> None:
        pass

    def resume(self, tags) -> None:
        pass


def _vllm_worker(engine: Engine, monkeypatch, get_model=None):
    """vLLM's own ``Worker`` over the harness's model (no device, no distributed
    group: the state its sleep, wake-up, step and weight methods touch); rank 0's
    connector is this process's EC transfer agent."""
    from vllm.distributed.ec_transfer import ec_transfer_state
    from vllm.v1.worker.gpu_worker import Worker

    monkeypatch.setattr(ec_transfer_state, "_EC_CONNECTOR_AGENT", engine.workers[0])
    # A CPU host has no accelerator to synchronize or measure around a sleep.
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *args: None)
    monkeypatch.setattr(torch.accelerator, "get_memory_info", lambda *args: (1 << 30, 1 << 31))
    worker = object.__new__(Worker)
    worker.vllm_config = engine.vllm_config
    worker.speculative_config = None
    worker.weight_transfer_engine = _TransferBackend()
    worker._weight_update_active = False
    worker._weight_update_is_draft = False
    worker._sleep_mode_backend = _SleepBackend()
    worker._sleep_saved_parameters = {}
    worker._sleep_saved_buffers = {}
    worker._sleep_saved_draft_buffers = {}
    worker._pp_send_work = []
    worker.profiler = None
    worker.use_v2_model_runner = False
    worker.model_runner = types.SimpleNamespace(
        model=engine.model,
        get_model=get_model or (lambda: engine.model),
        get_draft_model=lambda: None,
        reset_lora_state=lambda: None,
        execute_model=lambda scheduler_output, intermediate_tensors: None,
    )
    return worker


def _weights(engine: Engine) -> str | None:
    return engine.workers[0].worker.weights


# -- sleep, a sync through no seam, wake up ----------------------------------


def test_a_weight_sync_between_sleep_and_wake_up_is_fingerprinted_at_the_next_step(
    model_config, extra, monkeypatch
):
    """llm.sleep(), wake_up(["weights"]), collective_rpc(load_weights), wake_up(["kv_cache"]):
    the engine's cache reset ran before the sleep, on the old weights."""
    from vllm.v1.worker.gpu_worker import Worker

    stored, fresh = image_hash("slept-stored.png"), image_hash("slept-fresh.png")
    _store(model_config, extra, stored, W1)
    engine = _engine(model_config, extra, W1)
    try:
        worker = _vllm_worker(engine, monkeypatch)
        key = _weights(engine)
        engine.update_weights(W1)  # pause(clear_cache=True) resets the caches, on W1
        Worker.sleep(worker, level=1)
        assert _weights(engine) is None  # unknown from the sleep on
        Worker.wake_up(worker, ["weights"])
        _load_vision_tower(engine, W2)
        Worker.wake_up(worker, ["kv_cache"])
        assert _weights(engine) is None  # waking says nothing: weights may load after it
        Worker.execute_model(worker, NO_TOKENS)  # the first step after waking
        assert _weights(engine) == weights_fingerprint(engine.model) != key
        _serve(engine, stored)
        _serve(engine, fresh)
        assert engine.encoded == [stored, fresh]  # W1's entry is not W2's output
        assert bit_equal(engine.gathered[stored], encoder_output(stored, W2))
        engine.flush()
    finally:
        engine.shutdown()
    assert not _read(model_config, extra, fresh, W1)  # W2's output never under W1's key
    assert _read(model_config, extra, fresh, W2)
    assert _read(model_config, extra, stored, W1)  # W1's entry untouched


def test_while_asleep_no_seam_reads_the_weights_and_the_next_step_reads_them_once(
    model_config, extra, monkeypatch
):
    """A sleeping worker's weights may be off the device: a seam firing meanwhile
    leaves them unknown, and the next step fingerprints them."""
    from vllm.v1.worker.gpu_worker import Worker

    engine = _engine(model_config, extra, W1)
    reads = []
    try:
        worker = _vllm_worker(engine, monkeypatch, lambda: reads.append(1) or engine.model)
        Worker.sleep(worker, level=1)
        Worker.start_weight_update(worker)
        _load_vision_tower(engine, W2)
        Worker.finish_weight_update(worker)  # would fingerprint, awake
        assert reads == [] and _weights(engine) is None
        Worker.execute_model(worker, NO_TOKENS)
        Worker.execute_model(worker, NO_TOKENS)  # a flag test per step, no more
        assert reads == [1]
        assert _weights(engine) == weights_fingerprint(engine.model)
    finally:
        engine.shutdown()


# -- reset_weights -------------------------------------------------------------


def test_reset_weights_is_a_weight_change(model_config, extra, monkeypatch):
    """collective_rpc("reset_weights") (POST /weight_checker {"action": "reset"})
    zeroes every weight in place, through no other seam."""
    from vllm.v1.worker.gpu_worker import Worker

    image = image_hash("zeroed.png")
    _store(model_config, extra, image, W1)
    engine = _engine(model_config, extra, W1)
    try:
        worker = _vllm_worker(engine, monkeypatch)
        key = _weights(engine)
        Worker.reset_weights(worker)
        engine.weights_seed = ZEROED
        assert not any(parameter.any() for parameter in engine.model.parameters())
        assert _weights(engine) == weights_fingerprint(engine.model) != key
        _serve(engine, image)
        assert engine.encoded == [image]  # W1's entry is not loaded into the zeroed encoder
        engine.flush()
    finally:
        engine.shutdown()
    assert _read(model_config, extra, image, W1)  # and the zeroed output is not under W1's key


# -- weights unknown: nothing read under the key of no weights ------------------


def test_a_load_missing_its_staged_copy_reads_nothing_while_the_weights_are_unknown(
    model_config, extra
):
    """Unknown weights key the cache under ``weights=""``: the key of a deployment
    of the same model without a fingerprint, whose output must never be read."""
    image = image_hash("unknown-direct.png")
    other = Engine(
        make_vllm_config(model_config, "ec_both", {**extra, "weights_fingerprint": False}),
        runner="v1",
    )
    other.weights_seed = OTHER
    try:
        _serve(other, image)
        other.flush()
    finally:
        other.shutdown()
    engine = _engine(model_config, extra, W1)
    try:
        engine.workers[0].weights_changed(None)  # start_weight_update: unknown
        worker = engine.workers[0].worker
        encoder_cache: dict[str, torch.Tensor] = {}
        worker.start_load_caches(encoder_cache, ECTierConnectorMetadata(loads={image: NUM_EMBEDS}))
        assert image not in encoder_cache
        report = worker.build_worker_meta()
        assert report is not None and report.stats["load_misses_weights_unknown"] == 1
        assert "load_direct_reads" not in report.stats
    finally:
        engine.shutdown()


# -- a change the scheduler hears a report later (no stage channel) --------------


def _ready_without_a_channel(model_config, extra, image: str) -> tuple[Engine, list[str]]:
    """An engine whose scheduler reaches no worker over a stage channel (it learns the
    weights from the step reports), with ``image`` staged READY for a deferred request
    behind a running one."""
    _store(model_config, extra, image, W1)
    engine = _engine(model_config, {**extra, "busy_stage_wait_s": 0.0}, W1)
    for worker in engine.workers:
        worker._listener.close()  # a rank the scheduler cannot reach
    busy = engine.add_request([], max_tokens=60)
    engine.step()
    engine.step()
    scheduler = engine.connector.scheduler
    assert scheduler.weights == _weights(engine)  # heard from the step reports
    request = engine.add_request([image])
    step_until(engine, lambda: scheduler.items.state(image) is S.READY)
    return engine, [request, busy]


def test_a_load_promised_before_the_scheduler_hears_of_a_weight_transfer_never_misses(
    model_config, extra, monkeypatch
):
    """A transfer session starts between steps; the scheduler, one report behind,
    loads an item staged under W1. vLLM keeps its own W1 outputs across a session:
    so does the worker, for that load only."""
    from vllm.v1.worker.gpu_worker import Worker

    image = image_hash("promised-transfer.png")
    engine, requests = _ready_without_a_channel(model_config, extra, image)
    try:
        worker = _vllm_worker(engine, monkeypatch)
        Worker.start_weight_update(worker)
        _load_vision_tower(engine, HALF)
        engine.run_until_finished(requests)  # no "Encoder cache miss"
        assert engine.encoded == []
        assert bit_equal(engine.gathered[image], encoder_output(image, W1))
        assert engine.ec_stats["loads_kept_across_weights"] == 1
        assert engine.ec_stats.get("load_direct_reads", 0) == 0
        assert engine.workers[0].worker.staged_bytes == 0  # nothing kept after its load
    finally:
        engine.shutdown()


def test_an_item_staged_before_a_weight_transfer_is_encoded_after_it(
    model_config, extra, monkeypatch
):
    """A transfer session resets no cache of vLLM's: over the stage channel the
    scheduler hears the change before its next step, and gives up what the old
    weights staged; the worker's copy is released, never loaded."""
    from vllm.v1.worker.gpu_worker import Worker

    image = image_hash("staged-transfer.png")
    _store(model_config, extra, image, W1)
    engine = _engine(model_config, {**extra, "busy_stage_wait_s": 0.0}, W1)
    try:
        scheduler = engine.connector.scheduler
        busy = engine.add_request([], max_tokens=60)
        engine.step()
        request = engine.add_request([image])
        step_until(engine, lambda: scheduler.items.state(image) is S.READY)
        worker = _vllm_worker(engine, monkeypatch)
        Worker.start_weight_update(worker)
        _load_vision_tower(engine, W2)
        Worker.finish_weight_update(worker)
        engine.run_until_finished([request, busy])
        assert engine.encoded == [image]
        assert bit_equal(engine.gathered[image], encoder_output(image, W2))
        assert engine.ec_stats.get("loads_kept_across_weights", 0) == 0
        step_until(engine, lambda: engine.workers[0].worker.staged_bytes == 0)
    finally:
        engine.shutdown()


def test_nothing_staged_before_an_encoder_cache_reset_is_loaded_after_it(model_config, extra):
    """reload_weights with the engine's reset_encoder_cache between steps: the
    scheduler gives up what is staged (vLLM dropped its own old outputs), so the
    item is encoded under W2, and the engine never misses a promised load."""
    image = image_hash("promised-reset.png")
    engine, requests = _ready_without_a_channel(model_config, extra, image)
    try:
        engine.update_weights(W2)
        engine.run_until_finished(requests)
        assert engine.encoded == [image]
        assert bit_equal(engine.gathered[image], encoder_output(image, W2))
        assert engine.ec_stats.get("loads_kept_across_weights", 0) == 0
        # The scheduler released the copy staged under W1: the worker holds nothing.
        step_until(engine, lambda: engine.workers[0].worker.staged_bytes == 0)
    finally:
        engine.shutdown()


# -- tensor parallelism: a fingerprint failing on one rank ------------------------


class _DigestFails(torch.nn.Module):
    """A model whose digest fails on this rank (a CUDA OOM on the fuller rank)."""

    def named_parameters(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (on this rank only)")


class _ThreadGroup:
    """An all_gather between threads, standing in for the tensor-parallel group's;
    ``completed`` lists the ranks whose gather returned."""

    def __init__(self, ranks: int) -> None:
        self._barrier = threading.Barrier(ranks, timeout=10)
        self._slots: list[torch.Tensor | None] = [None] * ranks
        self.completed: list[int] = []
        self.local = threading.local()

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        rank = self.local.rank
        self._slots[rank] = local.clone()
        self._barrier.wait()
        self.completed.append(rank)
        return torch.cat(self._slots)

    def run(self, ranks: int, call) -> dict[int, object]:
        """``call(rank)`` on one thread per rank; what each returned or raised."""
        results: dict[int, object] = {}

        def one(rank: int) -> None:
            self.local.rank = rank
            try:
                results[rank] = call(rank)
            except Exception as exc:
                results[rank] = exc

        threads = [threading.Thread(target=one, args=(rank,)) for rank in range(ranks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        return results


def test_a_fingerprint_failing_on_one_rank_fails_on_every_rank_and_none_waits():
    group = _ThreadGroup(2)
    models = {0: _DigestFails(), 1: TinyVLM(W1)}
    results = group.run(2, lambda rank: weights_fingerprint(models[rank], group.gather))
    assert sorted(group.completed) == [0, 1]  # both joined the gather
    assert all(isinstance(results[rank], FingerprintError) for rank in (0, 1)), results


def test_a_rank_whose_model_cannot_be_reached_still_joins_the_gather(
    model_config, extra, monkeypatch
):
    """weights_changed on every rank (a seam fired on each); rank 0's get_model()
    raises: it joins its peers' gather, and every rank's weights are unknown."""
    engine = Engine(make_vllm_config(model_config, "ec_both", extra, tp_size=2), tp_size=2)
    group = _ThreadGroup(2)
    monkeypatch.setattr(connector_module, "tp_gather", lambda: group.gather)

    def model_of(rank: int):
        def get_model():
            if rank == 0:
                raise RuntimeError("no model on this rank")
            return engine.model

        return get_model

    try:
        group.run(2, lambda rank: engine.workers[rank].weights_changed(model_of(rank)))
        assert sorted(group.completed) == [0, 1]
        assert [worker.worker.weights for worker in engine.workers] == [None, None]
    finally:
        engine.shutdown()


# -- saves reported under the weights that made them --------------------------------


def test_a_save_landed_under_the_old_weights_is_not_reported_under_the_new(model_config, extra):
    """The save lands after its step's report and before the update: reported under
    the new weights, it would say the tiers hold the item for them, and an
    encode-only instance would never encode it again."""
    image = image_hash("saved-across.png")
    producer = Engine(make_vllm_config(model_config, "ec_producer", extra), runner="v2")
    try:
        gate = hold_puts(producer)
        request = producer.add_request([image])
        producer.step()
        gate.set()
        producer.flush()  # landed under the first weights, between steps
        producer.update_weights(W2)
        producer.run_until_finished([request])
        producer.encoded.clear()
        producer.run_until_finished([producer.add_request([image])])
        producer.flush()
        assert producer.encoded == [image]  # encoded for W2 ...
        assert producer.workers[0].worker.cache.contains(image)  # ... and stored under W2
    finally:
        producer.shutdown()
