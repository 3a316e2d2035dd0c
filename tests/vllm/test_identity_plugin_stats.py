"""Plugin registration, identity of entries, identifier policy, stats plumbing."""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from vllm.config import ECTransferConfig
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorLogging, ECConnectorProm

from lmcache_ec.integration.vllm.connector import LMCacheECTierConnector
from lmcache_ec.integration.vllm.features_off import OffLevels
from lmcache_ec.integration.vllm.identity import (
    encoder_fingerprint,
    identity_from_vllm,
    is_content_identifier,
)
from lmcache_ec.integration.vllm.metadata import ECTierWorkerMetadata
from lmcache_ec.integration.vllm.stats import ECTierConnectorStats

from .harness import Engine, image_hash, make_vllm_config


def test_entry_point_registers_the_connector_by_name():
    [entry] = [
        ep
        for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
        if ep.name == "lmcache_ec"
    ]
    entry.load()()  # idempotent, as vLLM may run plugins in several processes
    by_name = ECTransferConfig(ec_connector="LMCacheECTierConnector", ec_role="ec_both")
    assert ECConnectorFactory.get_connector_class(by_name) is LMCacheECTierConnector
    by_path = ECTransferConfig(
        ec_connector="LMCacheECTierConnector",
        ec_role="ec_consumer",
        ec_connector_module_path="lmcache_ec.integration.vllm",
    )
    ECConnectorFactory._registry.pop("LMCacheECTierConnector")
    try:
        assert ECConnectorFactory.get_connector_class(by_path) is LMCacheECTierConnector
    finally:
        entry.load()()


def test_identity_covers_model_revision_encoder_config_and_dtype(model_config):
    config = make_vllm_config(model_config, "ec_both", {})
    identity = identity_from_vllm(config, model=None, namespace="default")
    assert identity.model.endswith("tiny-blip2") and identity.dtype == "bfloat16"
    changed = copy.deepcopy(model_config)
    changed.hf_config.vision_config.image_size = 56
    assert encoder_fingerprint(changed) != identity.fingerprint
    changed = copy.deepcopy(model_config)
    changed.hf_config.text_config.num_hidden_layers = 2  # not the encoder
    assert encoder_fingerprint(changed) == identity.fingerprint
    other = identity_from_vllm(config, model="other/model", namespace="default")
    assert other.key("x" * 64).storage_name != identity.key("x" * 64).storage_name


def test_processor_kwargs_alone_and_quantization_alone_change_the_identity(model_config):
    base = encoder_fingerprint(model_config)
    with_kwargs = copy.deepcopy(model_config)
    with_kwargs.multimodal_config.mm_processor_kwargs = {"num_query_tokens": 16}
    assert encoder_fingerprint(with_kwargs) != base
    quantized = copy.deepcopy(model_config)
    quantized.quantization = "fp8"
    assert encoder_fingerprint(quantized) != base
    assert encoder_fingerprint(copy.deepcopy(model_config)) == base


def test_identifier_policy():
    assert is_content_identifier(image_hash("a"))
    assert not is_content_identifier("my-lora:" + image_hash("a"))  # a name, not content
    assert is_content_identifier("f" * 128)  # sha512
    assert not is_content_identifier("renderer0-mm-3-" + image_hash("a")[:8])
    assert not is_content_identifier("user-uuid-1234")


def test_request_scoped_ids_are_not_persisted_unless_allowed(model_config, disk_dir, monkeypatch):
    base = {"max_local_cpu_size": 0.01, "local_disk": str(disk_dir), "max_local_disk_size": 0.1}
    configs = [
        make_vllm_config(model_config, "ec_both", {"lmcache_config": base}),
        make_vllm_config(
            model_config, "ec_both", {"lmcache_config": base, "persist_non_content_ids": True}
        ),
    ]
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    for config, expected in zip(configs, (0, 1), strict=True):
        engine = Engine(config)
        try:
            engine.run_until_finished([engine.add_request(["renderer0-mm-0-1a2b"])])
            engine.flush()
        finally:
            engine.shutdown()
        assert len([n for n in os.listdir(disk_dir) if n.endswith(".pt")]) == expected


def test_worker_metadata_needs_every_rank_before_an_item_is_ready():
    a = ECTierWorkerMetadata(saved={"x"}, staged={"i": 1}, stats={"hits_disk": 1})
    b = ECTierWorkerMetadata(staged={"i": 1, "j": 1}, failed={"k"}, stats={"hits_disk": 2})
    merged = a.aggregate(b)
    assert merged.staged == {"i": 2, "j": 1} and merged.failed == {"k"}
    assert merged.saved == {"x"} and merged.stats == {"hits_disk": 3}


def test_stats_flow_into_vllm_logging_and_prometheus(model_config):
    config = make_vllm_config(model_config, "ec_both", {})
    data = {
        "hits_disk": 2,
        "misses": 1,
        "bytes_out": 1024,
        "loads": 2,
        "load_seconds": 0.002,
        "channel_bad_frames": 1,
        "scheduler_channel_breaks": 1,
        "purges_seen": 1,
    }
    logging_ = ECConnectorLogging(config.ec_transfer_config)
    logging_.observe(data)
    logging_.observe(data)
    reduced = logging_.transfer_stats_accumulator.reduce()
    assert reduced["hits_disk"] == 4 and reduced["hit_rate"] == round(4 / 6, 4)
    assert reduced["avg_load_ms"] == 1.0

    prom = ECConnectorProm(config, ["model_name", "engine"], {0: ["m", "0"]})
    prom.observe(data, engine_idx=0)
    labels = {"model_name": "m", "engine": "0"}
    assert REGISTRY.get_sample_value("vllm:lmcache_ec_bytes_loaded_total", labels) == 1024
    assert REGISTRY.get_sample_value("vllm:lmcache_ec_hits_total", {**labels, "tier": "disk"}) == 2
    channel = ("channel_bad_frames", "scheduler_channel_breaks", "purges_seen")
    for name in channel:
        assert REGISTRY.get_sample_value(f"vllm:lmcache_ec_{name}_total", labels) == 1
    # Features off arrive as levels: the processes (scheduler, worker ranks)
    # that have the feature off now, 0 once it is back on everywhere.
    off = "feature_off:stage_channel:directory_taken"
    gauge = {**labels, "feature": "stage_channel", "reason": "directory_taken"}
    for level in (2, 0):
        prom.observe({off: level}, engine_idx=0)
        assert REGISTRY.get_sample_value("vllm:lmcache_ec_feature_off", gauge) == level
    # A counter only grows: a negative value (a bad report) is not counted, and
    # never raised into vLLM's output handler.
    prom.observe({"misses": -1, "hits_disk": -1}, engine_idx=0)
    assert REGISTRY.get_sample_value("vllm:lmcache_ec_misses_total", labels) == 1


def _front_end(config) -> tuple[ECConnectorProm, CollectorRegistry]:
    """The connector's metrics as one of vLLM's API servers holds them."""
    registry = CollectorRegistry()

    class Front(ECConnectorProm):
        _gauge_cls = functools.partial(Gauge, registry=registry)
        _counter_cls = functools.partial(Counter, registry=registry)
        _histogram_cls = functools.partial(Histogram, registry=registry)

    return Front(config, ["model_name", "engine"], {0: ["m", "0"]}), registry


def test_a_feature_off_is_shown_right_by_whichever_front_end_gets_its_step(model_config):
    """vLLM hands a step's stats to one of its front-ends only: the engine core
    keeps the level, so a front-end that saw only the latest change shows it."""
    config = make_vllm_config(model_config, "ec_both", {})
    levels = OffLevels()
    off = "feature_off:stage_channel:directory_taken"
    steps = [levels.apply({off: 1}), levels.apply({off: 1, "loads": 1}), levels.apply({off: -1})]
    (first, first_registry), (second, second_registry) = _front_end(config), _front_end(config)
    for step in steps[:2]:
        first.observe(step, engine_idx=0)
    second.observe(steps[2], engine_idx=0)
    gauge = {"model_name": "m", "engine": "0"}
    gauge |= {"feature": "stage_channel", "reason": "directory_taken"}
    assert first_registry.get_sample_value("vllm:lmcache_ec_feature_off", gauge) == 2
    assert second_registry.get_sample_value("vllm:lmcache_ec_feature_off", gauge) == 1
    back_on = ECTierConnectorStats(data=levels.apply({off: -1}))
    assert back_on.data == {off: 0} and not back_on.is_empty()  # news: its level is 0
