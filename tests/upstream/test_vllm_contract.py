"""vLLM internals the connector relies on, pinned: a failure names the upstream change.

Each test says what lmcache-ec uses and why the public API does not suffice
(see docs/architecture.md, "Upstream internals").
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch
from vllm.distributed.ec_transfer import (
    ensure_ec_transfer_initialized,
    ensure_ec_transfer_shutdown,
    get_ec_transfer,
)

from lmcache_ec.integration.vllm import seams
from lmcache_ec.integration.vllm.weights import weights_fingerprint
from tests.vllm.conftest import _registered, extra, model_config  # noqa: F401  (fixtures)
from tests.vllm.harness import TinyVLM, make_vllm_config


def test_every_weight_seam_exists():
    """seams.py wraps these to learn of weight updates: no EC connector hook exists."""
    assert seams.missing() == [], (
        f"vLLM moved {seams.missing()}: weight updates would go unseen; update seams.SEAMS"
    )


@pytest.fixture
def worker_connector(model_config, extra):  # noqa: F811
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
    assert list(inspect.signature(Worker.finish_weight_update).parameters) == ["self"]
    assert "model_runner" in inspect.getsource(Worker.load_model)


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
