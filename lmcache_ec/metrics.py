"""Counters of one ECCache: hits per tier, misses, bytes, integrity failures, latency.

One place for every number the engine reports; exporters (Prometheus in
``metrics_export.py``, vLLM's connector stats, the CLI) read ``snapshot()``.

Latency histograms are kept here, from the per-operation durations the engine
already passes to ``hit``/``miss``/``put``: ``get`` covers the whole tier walk
(including verification and the copy to the caller's device); ``put`` covers
validation, framing and the hand-off to the CPU tier (lower tiers are written
in the background and are not on the caller's path).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

# Upper bounds in seconds (Prometheus ``le``); +Inf is implicit.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
    5.0,
)


class LatencyHistogram:
    """Fixed-bucket histogram; not thread-safe on its own (ECStats locks)."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last slot: above every bound
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.count += 1
        self.total += seconds

    def snapshot(self) -> dict[str, Any]:
        """``buckets``: (upper bound, cumulative count) pairs, ending with +Inf."""
        cumulative, running = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return {"buckets": cumulative, "count": self.count, "sum": self.total}


class ECStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hits: Counter[str] = Counter()  # by tier
        self.tier_errors: Counter[str] = Counter()  # by tier
        self.misses = 0
        self.puts = 0
        self.put_skipped_existing = 0
        self.put_rejected = 0  # put returned False: CPU pool full, or the node write failed
        self.integrity_failures = 0
        self.purges_seen = 0  # purge generations (lmcache-ec purge) acted on
        # get_or_compute: entries computed here, waits for another instance's
        # computation (and those that ended in a load), results refused
        self.computes = 0
        self.compute_waits = 0
        self.compute_waits_loaded = 0
        self.compute_rejected = 0
        self.compute_not_stored = 0
        self.bytes_in = 0  # accepted by put
        self.bytes_out = 0  # returned by get
        self.get_seconds = 0.0
        self.put_seconds = 0.0
        self._tier_sources: dict[str, Callable[[], dict[str, Any]]] = {}
        self._features_off: Callable[[], dict[str, str]] = dict
        self.get_latency = LatencyHistogram()
        self.put_latency = LatencyHistogram()

    def hit(self, tier: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.hits[tier] += 1
            self.bytes_out += nbytes
            self.get_seconds += seconds
            self.get_latency.observe(seconds)

    def miss(self, seconds: float) -> None:
        with self._lock:
            self.misses += 1
            self.get_seconds += seconds
            self.get_latency.observe(seconds)

    def put(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.puts += 1
            self.bytes_in += nbytes
            self.put_seconds += seconds
            self.put_latency.observe(seconds)

    def add(self, field: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self, field, getattr(self, field) + amount)

    def tier_error(self, tier: str) -> None:
        with self._lock:
            self.tier_errors[tier] += 1

    def watch_tier(self, tier: str, source: Callable[[], dict[str, Any]]) -> None:
        """Report ``source()`` (a tier's own health counters) under ``tiers[tier]``.

        A ``failures`` counter in it adds to ``tier_errors[tier]``: tiers that
        turn failures into misses (the remote tier) still show them there.
        """
        with self._lock:
            self._tier_sources[tier] = source

    def watch_features(self, source: Callable[[], dict[str, str]]) -> None:
        """Report ``source()`` (features off for want of a private runtime
        directory: name -> reason) under ``features_off``."""
        with self._lock:
            self._features_off = source

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            sources = dict(self._tier_sources)
            features_off = self._features_off
        tiers = {tier: state for tier, source in sources.items() if (state := source()) is not None}
        off = features_off()
        with self._lock:
            lookups = sum(self.hits.values()) + self.misses
            tier_errors = self.tier_errors.copy()
            for tier, state in tiers.items():
                tier_errors[tier] += int(state.get("failures", 0))
            return {
                "hits": dict(self.hits),
                "misses": self.misses,
                "hit_rate": (sum(self.hits.values()) / lookups) if lookups else 0.0,
                "puts": self.puts,
                "put_skipped_existing": self.put_skipped_existing,
                "put_rejected": self.put_rejected,
                "integrity_failures": self.integrity_failures,
                "purges_seen": self.purges_seen,
                "get_or_compute": {
                    "computes": self.computes,
                    "waits": self.compute_waits,
                    "waits_loaded": self.compute_waits_loaded,
                    "rejected": self.compute_rejected,
                    "not_stored": self.compute_not_stored,
                },
                "tier_errors": {tier: n for tier, n in tier_errors.items() if n},
                "tiers": tiers,
                "features_off": off,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
                "get_seconds": self.get_seconds,
                "put_seconds": self.put_seconds,
                "get_latency": self.get_latency.snapshot(),
                "put_latency": self.put_latency.snapshot(),
            }
