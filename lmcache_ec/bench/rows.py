"""The unit of every benchmark result: one row per (tier, shape, operation).

A row is a JSON-ready dict::

    {"tier": "cpu", "op": "get", "shape": [256, 2560], "dtype": "bfloat16",
     "bytes": 1310720, "batch": 1, "note": "",
     "ours":     {"label", "n", "median_ms", "p99_ms", "mb_s", "hits", "note", ...},
     "upstream": same keys | {"label", "na": reason} | None,
     "example":  ...,          # vLLM's ECExampleConnector
     "limit":    ...,          # the same bytes moved by torch / the OS / the bare client
     "cpu_only": ...,          # put rows below the CPU tier: the same put, CPU tier only
     "verified": ...,          # disk reads: readinto + one xxh3 (a verifying read's floor)
     "cpu_read": ...,          # CPU get: LMCache's CPU backend alone (lookup, copy, release)
     "ours_read_once": ..., "example_read_once": ..., "verified_read_once": ...}
                               # disk get: each result read once, in a pass of their own

``median_ms``/``p99_ms`` are per item (a ``get_many`` call of ``batch`` items
is divided by ``batch``); ``mb_s`` is item bytes over the median. ``hits``
counts results that equal the stored tensor (None where nothing is read).
Ratios (to ours, and the references between two other cells) and targets
are added by ``lmcache_ec.bench.targets``.
"""

from __future__ import annotations

from typing import Any

import torch

OURS = "ours"
BASELINES = ("upstream", "example", "limit")
ENGINES = (OURS, *BASELINES)


def make_row(
    tier: str,
    op: str,
    shape: tuple[int, int] | list[int] | None,
    dtype: torch.dtype | str | None,
    nbytes: int | None,
    *,
    ours: dict[str, Any],
    upstream: dict[str, Any] | None = None,
    example: dict[str, Any] | None = None,
    limit: dict[str, Any] | None = None,
    cpu_only: dict[str, Any] | None = None,
    verified: dict[str, Any] | None = None,
    note: str = "",
    **references: dict[str, Any],
) -> dict[str, Any]:
    """``references``: further measured cells a target's reference ratio uses
    (``targets.REFERENCES``)."""
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    return {
        "tier": tier,
        "op": op,
        "shape": list(shape) if shape is not None else None,
        "dtype": dtype,
        "bytes": nbytes,
        "batch": 1,
        "note": note,
        "ours": ours,
        "upstream": upstream,
        "example": example,
        "limit": limit,
        **({"cpu_only": cpu_only} if cpu_only is not None else {}),
        **({"verified": verified} if verified is not None else {}),
        **references,
    }


def skipped_row(tier: str, reason: str) -> dict[str, Any]:
    """A tier that was requested and not measured; ``reason`` says why."""
    return {"tier": tier, "op": "*", "shape": None, "skipped": reason}


def pool_gb(entries: int, nbytes: int) -> float:
    """A CPU tier that holds ``entries`` frames of ``nbytes`` with room to spare."""
    return max(0.05, entries * (nbytes + 8192) * 1.25 / 1024**3)


def sample_tensors(
    shape: tuple[int, int], dtype: torch.dtype, count: int = 8
) -> list[torch.Tensor]:
    """A few distinct tensors, cycled through so caches do not see one buffer only."""
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=generator).to(dtype) for _ in range(count)]
