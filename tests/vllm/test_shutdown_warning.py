"""vLLM's default ``shutdown_timeout`` (0) kills the engine at SIGTERM before any
connector shuts down: a producer's worker says so at start, once, naming the
``--shutdown-timeout`` that lets queued writes land (``close_timeout``)."""

from __future__ import annotations

import logging

import pytest
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory

from .harness import make_vllm_config

WARNING = "vLLM's shutdown_timeout is 0"


def _worker_warnings(model_config, role: str, shutdown_timeout: int, caplog) -> list[str]:
    extra = {"lmcache_config": {"max_local_cpu_size": 0.01, "close_timeout": 7.5}}
    config = make_vllm_config(model_config, role, extra)
    config.shutdown_timeout = shutdown_timeout
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lmcache_ec"):
        connector = ECConnectorFactory.create_connector(config, ECConnectorRole.WORKER)
    connector.shutdown()
    return [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]


@pytest.mark.parametrize("role", ["ec_both", "ec_producer"])
def test_a_producer_killed_at_shutdown_says_so_once_with_the_timeout_to_pass(
    model_config, role, caplog
):
    (warning,) = _worker_warnings(model_config, role, 0, caplog)
    assert "--shutdown-timeout 8 (close_timeout)" in warning


def test_no_warning_with_a_shutdown_timeout_or_on_a_consumer(model_config, caplog):
    assert _worker_warnings(model_config, "ec_both", 8, caplog) == []
    assert _worker_warnings(model_config, "ec_consumer", 0, caplog) == []
