"""Benchmarks that measure lmcache-ec next to a baseline in the same run.

- ``local``: CPU and disk tiers, ``ECCache`` against LMCache's own
  ``ECCacheEngine`` on the same tiers, with raw copies/reads as the floor.

Each module returns plain dicts (JSON-ready); the CLI renders them.
"""
