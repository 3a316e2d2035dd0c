"""Benchmarks that measure lmcache-ec next to a baseline in the same run.

- ``local``: CPU and disk tiers, ``ECCache`` against LMCache's own
  ``ECCacheEngine`` on the same tiers, with raw copies/reads as the floor.
- ``remote``: ``ECCache`` on Redis or S3 against the raw client (redis-py,
  boto3) moving the same bytes.
- ``connector``: the vLLM connector's ``has_cache_item`` and ``save_caches``.

Each module returns plain dicts (JSON-ready); the CLI renders them.
"""

from __future__ import annotations

import statistics
from typing import Any


def result_row(
    tier: str, op: str, engine: str, shape: Any, dtype: str, times: list[float], **extra: Any
) -> dict[str, Any]:
    """One measured row: median and p99 milliseconds of ``times`` (seconds)."""
    ms = sorted(t * 1000 for t in times)
    return {
        "tier": tier,
        "op": op,
        "engine": engine,
        "shape": list(shape),
        "dtype": dtype,
        "n": len(ms),
        "median_ms": statistics.median(ms) if ms else None,
        "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))] if ms else None,
        **extra,
    }
