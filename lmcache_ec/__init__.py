"""lmcache-ec: an encoder-output tier for LMCache.

``ECCache`` stores multimodal encoder outputs (``[tokens, hidden]`` tensors)
in LMCache's CPU, disk and remote tiers under ``ECKey`` (full ``mm_hash`` plus
encoder identity). See docs/ for configuration and the vLLM connector.
"""

from .codec import CorruptEntryError
from .config import ConfigError, ECConfig, load_config
from .engine import ECCache
from .key import ECKey, EncoderIdentity

__version__ = "0.1.0"

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
