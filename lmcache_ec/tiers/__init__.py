"""LMCache storage, extended where encoder outputs need more than the KV path.

- ``contract``: ``Tier``, what every tier offers the engine, and ``TierKind``.
- ``allocator``: the CPU pool, touched on use instead of zero-filled at start.
- ``local_cpu``: LocalCPUBackend whose hits refresh LRU order.
- ``local_disk``: LocalDiskBackend with atomic writes and an index that
  survives restarts and sees other processes' entries.
- ``manager``: the StorageManager that puts these in LMCache's tier order and
  lists them as ``Tier``s (``tiers()``), LMCache's plugins through an adapter.
"""

from .manager import TIER_NAMES, ECStorageManager, tier_name

__all__ = ["TIER_NAMES", "ECStorageManager", "tier_name"]
