"""vLLM on CPU and offline before any contract module imports it.

vLLM settles its platform on first import; PyPI's CUDA build (the vLLM 0.33
venv) needs ``VLLM_TARGET_DEVICE=cpu`` by then, as ``tests/vllm`` sets it.
"""

from __future__ import annotations

from tests.vllm import cpu_env  # noqa: F401  (sets the environment)
