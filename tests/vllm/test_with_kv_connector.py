"""The EC connector beside LMCache's KV connector: one vLLM config, one YAML file.

On a CPU-only machine LMCache's KV worker cannot build its GPU connector and
runs in its own degraded mode (no KV offload); its configuration, scheduler
side, worker object and shutdown are still the real ones, which is what
living side by side depends on.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import torch
import yaml
from lmcache.v1.cache_engine import CacheEngineKey
from vllm.config import KVTransferConfig, set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.parallel_state import (
    destroy_distributed_environment,
    destroy_model_parallel,
    ensure_model_parallel_initialized,
    init_distributed_environment,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

from tests.conftest import bit_equal

from .harness import BLOCK, Engine, encoder_output, image_hash, make_vllm_config

GB = 1024**3


@pytest.fixture
def lmcache_yaml(tmp_path, monkeypatch):
    """One file: the KV cache's keys at the top, the encoder tier's under ``ec:``."""
    path = tmp_path / "lmcache.yaml"
    document = {
        "chunk_size": 16,
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "ec": {
            "max_local_cpu_size": 0.01,
            "local_disk": str(tmp_path / "ec-disk"),
            "max_local_disk_size": 0.1,
        },
    }
    path.write_text(yaml.safe_dump(document))
    monkeypatch.setenv("LMCACHE_CONFIG_FILE", str(path))
    monkeypatch.setenv("LMCACHE_DISABLE_BANNER", "1")
    return document


@pytest.fixture
def combined_config(model_config, lmcache_yaml):
    kv = KVTransferConfig(kv_connector="LMCacheConnectorV1", kv_role="kv_both")
    # The EC connector reads $LMCACHE_CONFIG_FILE, as LMCache's KV connector does.
    config = make_vllm_config(model_config, "ec_both", {}, kv_transfer_config=kv)
    config.cache_config.kv_cache_layout = "NHD"  # the engine core resolves this in vLLM
    # LMCache's KV worker needs vLLM's tensor-parallel group: a 1-process gloo group.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            local_rank=0,
            backend="gloo",
        )
        ensure_model_parallel_initialized(1, 1)
    try:
        yield config
    finally:
        destroy_model_parallel()
        destroy_distributed_environment()


def _kv_cache_config() -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=16, dtype=torch.float32)
    return KVCacheConfig(
        num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )


def test_kv_and_ec_connectors_share_one_config_and_shut_down_together(
    combined_config, lmcache_yaml
):
    threads_before = set(threading.enumerate())
    kv_worker = KVConnectorFactory.create_connector(
        combined_config, KVConnectorRole.WORKER, _kv_cache_config()
    )
    engine = Engine(combined_config)  # vLLM's Scheduler builds both scheduler sides
    try:
        assert engine.scheduler.connector is not None  # the KV scheduler side
        assert engine.connector is not None  # the EC scheduler side
        ec_worker = engine.workers[0]

        # Each cache is sized by its own part of the file; neither inherits the other's.
        kv_config = kv_worker._lmcache_engine.config
        assert kv_config.max_local_cpu_size == 0.05
        ec_config = ec_worker.worker.cache.config
        assert ec_config.max_local_cpu_size == 0.01
        assert ec_worker.worker.cache.cpu_capacity <= int(0.01 * GB)

        # An image goes through the EC tier while the KV connector is loaded.
        image = image_hash("beside-kv.png")
        request = engine.add_request([image])
        engine.run_until_finished([request])
        engine.flush()
        assert engine.encoded == [image]
        disk_dir = Path(lmcache_yaml["ec"]["local_disk"])
        names = [p.name for p in disk_dir.rglob("*") if p.is_file()]
        assert names and all(name.startswith("ec1.") for name in names)
        # Encoder keys can never be read as KV keys (and KV keys carry '@').
        with pytest.raises(ValueError):
            CacheEngineKey.from_string(names[0].split(".pt")[0])
        stored = ec_worker.worker.cache.get(image)
        assert stored is not None and bit_equal(stored, encoder_output(image))
    finally:
        engine.shutdown()
        kv_worker.shutdown()
    leftover = [t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert not [name for name in leftover if name.startswith("ec-")], leftover
    assert all(t.daemon for t in set(threading.enumerate()) - threads_before), leftover
