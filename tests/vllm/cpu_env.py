"""vLLM on CPU, offline, with a weightless tiny BLIP-2 (see data/make_tiny_blip2.py).

Imported before vLLM is: vLLM settles its platform on first import.
"""

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

MODEL_DIR = os.path.join(os.path.dirname(__file__), "data", "tiny-blip2")
