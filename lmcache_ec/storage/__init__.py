"""The storage stack and the read path over it.

- ``manager``: the StorageManager that puts the tiers (``lmcache_ec.tiers``,
  ``lmcache_ec.remote``) in LMCache's tier order and lists them as ``Tier``s
  (``tiers()``), LMCache's plugins through an adapter.
- ``reads``: one lookup down the tiers, verified, promoted.
- ``read_pool``: the reads of one ``get_many`` batch on several threads.
- ``promotion``: disk hits copied into the CPU tier, off the caller's path.
- ``replay``: uploading, after a remote outage, what was written locally during it.
"""

from .manager import TIER_NAMES, ECStorageManager, tier_name

__all__ = ["TIER_NAMES", "ECStorageManager", "tier_name"]
