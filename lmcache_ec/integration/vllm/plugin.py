"""``vllm.general_plugins`` entry point: register the connector's name.

vLLM runs every general plugin at start-up in each process; ``register`` is
idempotent and imports nothing heavy (the factory loads the class lazily).
"""

from __future__ import annotations

import logging

from . import CONNECTOR_MODULE, CONNECTOR_NAME

logger = logging.getLogger(__name__)


def register() -> None:
    """Make ``ec_connector: LMCacheECTierConnector`` resolvable without a module path."""
    try:
        from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
    except ImportError:  # vLLM without EC transfer support: nothing to register
        logger.debug("vLLM has no ECConnectorFactory; %s not registered", CONNECTOR_NAME)
        return
    if CONNECTOR_NAME in ECConnectorFactory._registry:
        return
    ECConnectorFactory.register_connector(CONNECTOR_NAME, CONNECTOR_MODULE, CONNECTOR_NAME)
