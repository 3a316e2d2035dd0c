"""vLLM on CPU, offline, with a weightless tiny BLIP-2 (``cpu_env``); the vLLM
fixtures (``model_config``, ``extra``) are shared from tests/conftest.py."""

# ruff: noqa: I001  (the environment is set before anything imports vLLM)
from __future__ import annotations

from tests.vllm import cpu_env  # noqa: F401

import pytest

from lmcache_ec.integration.vllm.plugin import register


@pytest.fixture(scope="session", autouse=True)
def _registered():
    register()  # what vLLM's general-plugin loader does at start-up
