"""vLLM on CPU, offline, with a weightless tiny BLIP-2 (see data/make_tiny_blip2.py)."""

from __future__ import annotations

import os
import tempfile
from importlib import metadata

os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# vLLM caches model inspection under its cache root; keep it stable across
# tests (the shared conftest points XDG_CACHE_HOME at a per-test directory),
# one per vLLM version (the venvs' inspections would replace each other's).
os.environ.setdefault(
    "VLLM_CACHE_ROOT",
    os.path.join(
        tempfile.gettempdir(), f"lmcache-ec-vllm-{os.getuid()}-{metadata.version('vllm')}"
    ),
)

import pytest

from lmcache_ec.integration.vllm.plugin import register

MODEL_DIR = os.path.join(os.path.dirname(__file__), "data", "tiny-blip2")


@pytest.fixture(scope="session", autouse=True)
def _registered():
    register()  # what vLLM's general-plugin loader does at start-up


@pytest.fixture(scope="session")
def model_config():
    from vllm.config import ModelConfig

    return ModelConfig(model=MODEL_DIR, tokenizer=MODEL_DIR, max_model_len=256, dtype="bfloat16")


@pytest.fixture
def extra(disk_dir):
    """ec_connector_extra_config of a small CPU + disk tier shared by two engines."""
    return {
        "lmcache_config": {
            "max_local_cpu_size": 0.01,
            "local_disk": str(disk_dir),
            "max_local_disk_size": 0.1,
        }
    }
