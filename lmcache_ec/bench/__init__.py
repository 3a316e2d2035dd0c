"""Benchmarks that measure lmcache-ec next to a baseline in the same run.

``lmcache-ec bench`` (``run.py``) runs everything at once: every tier
(``local_tiers``, ``remote_tiers``), the vLLM connector's hot paths
(``connector_paths``) and start-up (``startup``), each job in a fresh worker
process (``worker``), against upstream ``ECCacheEngine``, vLLM's
``ECExampleConnector`` and the physical limit (``subjects``). ``targets``
adds ratios and pass/fail, ``report`` and ``chart`` render the result.

Focused subcommands keep their own modules: ``local`` (CPU and disk vs
upstream), ``remote`` (Redis/S3 vs the raw client), ``connector``
(``has_cache_item``/``save_caches``), ``steps`` (engine step time with
prefetch).

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
