"""The encoder tier as a vLLM ECConnector: ``LMCacheECTierConnector``.

Loadable by name once the ``vllm.general_plugins`` entry point has run
(``--ec-transfer-config '{"ec_connector": "LMCacheECTierConnector",
"ec_role": "ec_both"}'``) or by module path
(``"ec_connector_module_path": "lmcache_ec.integration.vllm"``).

The class is imported lazily so that loading the plugin does not import
LMCache.
"""

from typing import Any

CONNECTOR_NAME = "LMCacheECTierConnector"
CONNECTOR_MODULE = "lmcache_ec.integration.vllm.connector"


def __getattr__(name: str) -> Any:
    if name == CONNECTOR_NAME:
        from .connector import LMCacheECTierConnector

        return LMCacheECTierConnector
    raise AttributeError(name)


__all__ = ["CONNECTOR_MODULE", "CONNECTOR_NAME", "LMCacheECTierConnector"]
