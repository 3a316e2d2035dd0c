"""Timing primitives shared by every benchmark: interleaved calls, medians, p99.

Engines measured against each other run call by call in one loop, in an order
that flips every iteration, so drifting machine load (other processes, page
cache, CPU frequency) falls on all of them alike. A result that is checked is
dropped at once: holding it would make later calls fault in fresh pages and
penalise whichever engine runs first.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Series:
    """Seconds per call of one engine, and how many results passed the check."""

    times: list[float] = field(default_factory=list)
    hits: int | None = None


def interleave(
    calls: dict[str, Callable[[int], Any]],
    n: int,
    check: Callable[[int, Any], int] | None = None,
    checked: tuple[str, ...] | None = None,
) -> dict[str, Series]:
    """Call ``calls[name](i)`` for i < n and every name, interleaved.

    ``check(i, result)`` returns how many items of ``result`` are right (a
    bool for one item); it counts hits for the engines named in ``checked``
    (default: all of them). Its cost is outside the timed region.
    """
    names = list(calls)
    checked = tuple(names) if checked is None else checked
    series = {name: Series(hits=0 if check and name in checked else None) for name in names}
    for i in range(n):
        for name in names if i % 2 == 0 else reversed(names):
            started = time.perf_counter()
            out = calls[name](i)
            series[name].times.append(time.perf_counter() - started)
            if check is not None and name in checked:
                series[name].hits += int(check(i, out))  # type: ignore[operator]
            del out
    return series


def alternate(steps: list[Callable[[int], Any]], n: int) -> None:
    """Run ``steps[k](i)`` for i < n, all steps per i, the order flipping every i.

    For measurements that time themselves (a put, then a wait for its write).
    """
    for i in range(n):
        for step in steps if i % 2 == 0 else reversed(steps):
            step(i)


def wait_until(done: Callable[[], bool], timeout: float = 120.0, poll_s: float = 0.00005) -> bool:
    """Poll ``done`` until True; sleeps ``poll_s`` between polls (releases the GIL)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1): the smallest value with at least
    ``q`` of them at or below it (p99 of 100 is the 99th, not the maximum)."""
    ordered = sorted(values)
    # Rounded first: 0.07 * 100 is 7.000000000000001, whose ceiling is one rank too high.
    rank = math.ceil(round(len(ordered) * q, 9))
    return ordered[max(0, rank - 1)]


def summary(
    label: str,
    times: list[float],
    nbytes: int,
    *,
    per_call_items: int = 1,
    hits: int | None = None,
    note: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """One measured engine: per-item median/p99 (ms) and throughput (MB/s).

    ``times`` are seconds per call; a call may move ``per_call_items`` items
    of ``nbytes`` each (``get_many``), so times are divided per item.
    """
    ms = sorted(t * 1000 / per_call_items for t in times)
    median = statistics.median(ms) if ms else None
    return {
        "label": label,
        "n": len(ms) * per_call_items,
        "median_ms": median,
        "p99_ms": percentile(ms, 0.99) if ms else None,
        "mb_s": nbytes / 1e6 / (median / 1000) if median and nbytes else None,
        "hits": hits,
        "note": note,
        **extra,
    }


_MEDIAN_OF_RUNS = ("median_ms", "p99_ms", "mb_s")
_SUMMED_OVER_RUNS = ("hits", "in_flight", "stored")  # counts out of ``n``


def merge_repeats(
    runs: list[list[dict[str, Any]]],
    ratios: Callable[[dict[str, Any]], dict[str, float | None]],
) -> list[dict[str, Any]]:
    """The rows of several runs of one job as one set of rows.

    Each measured engine gets the median over the runs of its median, p99 and
    throughput, its per-run medians as ``runs_ms`` and its items and counts
    (hits, puts still writing at return, saves stored) summed; everything else
    is the first run's. A row's ``ratios`` are the median over the runs of
    ``ratios(row)`` of each run: a baseline is only
    compared with the run it was measured in. Raises ``ValueError`` when the
    runs measured different rows.
    """
    first = runs[0]
    if len(runs) == 1:
        return first
    shape = [(r.get("tier"), r.get("op"), r.get("shape")) for r in first]
    for other in runs[1:]:
        if [(r.get("tier"), r.get("op"), r.get("shape")) for r in other] != shape:
            raise ValueError("the runs of a job measured different rows")
    merged = []
    for index, row in enumerate(first):
        out = dict(row)
        for name, engine in row.items():
            if not isinstance(engine, dict) or engine.get("median_ms") is None:
                continue
            same = [run[index][name] for run in runs]
            combined = dict(engine)
            for key in _MEDIAN_OF_RUNS:
                values = [e[key] for e in same if e.get(key) is not None]
                combined[key] = statistics.median(values) if values else None
            combined["runs_ms"] = [e["median_ms"] for e in same]
            combined["n"] = sum(e.get("n") or 0 for e in same)
            for key in _SUMMED_OVER_RUNS:
                if engine.get(key) is not None:
                    combined[key] = sum(e.get(key) or 0 for e in same)
            out[name] = combined
        per_run = [ratios(run[index]) for run in runs]
        out["ratios"] = {
            name: _median_or_none([r.get(name) for r in per_run]) for name in per_run[0]
        }
        merged.append(out)
    return merged


def _median_or_none(values: list[float | None]) -> float | None:
    # A run without the ratio (a baseline that missed) leaves the row without it.
    return None if any(v is None for v in values) else statistics.median(values)


def not_available(label: str, reason: str) -> dict[str, Any]:
    """A baseline that cannot do this work; ``reason`` says why."""
    return {"label": label, "na": reason}
