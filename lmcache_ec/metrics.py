"""Counters of one ECCache: hits per tier, misses, bytes, integrity failures.

One place for every number the engine reports; exporters (Prometheus, vLLM's
connector stats, the CLI) read ``snapshot()``.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any


class ECStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hits: Counter[str] = Counter()  # by tier
        self.tier_errors: Counter[str] = Counter()  # by tier
        self.misses = 0
        self.puts = 0
        self.put_skipped_existing = 0
        self.put_rejected = 0  # no room in the CPU pool
        self.integrity_failures = 0
        self.bytes_in = 0  # accepted by put
        self.bytes_out = 0  # returned by get
        self.get_seconds = 0.0
        self.put_seconds = 0.0

    def hit(self, tier: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.hits[tier] += 1
            self.bytes_out += nbytes
            self.get_seconds += seconds

    def miss(self, seconds: float) -> None:
        with self._lock:
            self.misses += 1
            self.get_seconds += seconds

    def put(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.puts += 1
            self.bytes_in += nbytes
            self.put_seconds += seconds

    def add(self, field: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self, field, getattr(self, field) + amount)

    def tier_error(self, tier: str) -> None:
        with self._lock:
            self.tier_errors[tier] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            lookups = sum(self.hits.values()) + self.misses
            return {
                "hits": dict(self.hits),
                "misses": self.misses,
                "hit_rate": (sum(self.hits.values()) / lookups) if lookups else 0.0,
                "puts": self.puts,
                "put_skipped_existing": self.put_skipped_existing,
                "put_rejected": self.put_rejected,
                "integrity_failures": self.integrity_failures,
                "tier_errors": dict(self.tier_errors),
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
                "get_seconds": self.get_seconds,
                "put_seconds": self.put_seconds,
            }
