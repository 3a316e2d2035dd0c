"""The tiers: LMCache storage, extended where encoder outputs need more than the KV path.

Each module is one tier or a piece of one; the stack is assembled in
``lmcache_ec.storage`` and every tier implements ``lmcache_ec.tier_contract``.

- ``allocator``: the CPU pool, touched on use instead of zero-filled at start.
- ``local_cpu``: LocalCPUBackend whose hits refresh LRU order.
- ``disk_layout``, ``budget``, ``frame_directory``: a directory of frames
  shared by processes (file names, atomic writes, one size limit).
- ``local_disk``: the disk tier on it; ``node``: the node tier (/dev/shm).
- ``writer``: the one thread that runs the disk tier's writes.
"""
