"""lmcache-ec: an encoder-output tier for LMCache.

``ECCache`` stores multimodal encoder outputs (``[tokens, hidden]`` tensors)
in LMCache's CPU, disk and remote tiers under ``ECKey`` (full ``mm_hash`` plus
encoder identity). See docs/ for configuration and the vLLM connector.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .runtime_dirs import numba_cache_where_needed

__version__ = "0.1.0"

numba_cache_where_needed()  # before anything imports LMCache (its numba kernels)

# Attributes are imported on first use: importing LMCache configures its
# logging, and the CLI and the vLLM plugin need to act before that.
_EXPORTS = {
    "ConfigError": ".config",
    "CorruptEntryError": ".codec",
    "ECCache": ".engine",
    "ECConfig": ".config",
    "ECKey": ".key",
    "EncoderIdentity": ".key",
    "load_config": ".config",
}

__all__ = [
    "ConfigError",
    "CorruptEntryError",
    "ECCache",
    "ECConfig",
    "ECKey",
    "EncoderIdentity",
    "__version__",
    "load_config",
]

if TYPE_CHECKING:
    from .codec import CorruptEntryError
    from .config import ConfigError, ECConfig, load_config
    from .engine import ECCache
    from .key import ECKey, EncoderIdentity


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lmcache_ec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
