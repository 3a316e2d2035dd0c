"""The storage stack and the read path over it.

- ``manager``: the StorageManager that puts the tiers (``lmcache_ec.tiers``,
  ``lmcache_ec.remote``) in LMCache's tier order and lists them as ``Tier``s
  (``tiers()``), LMCache's plugins through an adapter.
- ``reads``: one lookup down the tiers, verified, promoted.
- ``read_pool``: the reads of one ``get_many`` batch on several threads.
- ``copy_out``: a hit's payload copied into the caller's tensor (host or device).
- ``promotion``: disk hits copied into the CPU tier, off the caller's path.
- ``replay``: uploading, after a remote outage, what was written locally during it.
- ``single_flight``: one computation per entry, in a process and across instances.
- ``get_or_compute``: ``ECCache.get_or_compute``'s flow on those primitives.
- ``compute_results``: ``get_or_compute``'s results checked before anything is stored.
"""

from .manager import TIER_NAMES, ECStorageManager, tier_name

__all__ = ["TIER_NAMES", "ECStorageManager", "tier_name"]
