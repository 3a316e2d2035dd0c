"""Prometheus export of ``ECStats`` for standalone use (outside vLLM).

Every scrape reads ``ECStats.snapshot()`` of each registered cache, so the
exported values are exactly the engine's counters; nothing is double-counted
and nothing needs a hook on the hot path. Metrics (all labelled with
``model`` and ``namespace``)::

    lmcache_ec_hits_total{tier}             gets answered, by tier
    lmcache_ec_misses_total                 gets that found nothing usable
    lmcache_ec_puts_total                   entries accepted by put
    lmcache_ec_put_skipped_existing_total   puts of entries already in the CPU tier
    lmcache_ec_put_rejected_total           puts not stored: CPU pool full, node write failed
    lmcache_ec_bytes_in_total               frame bytes accepted by put
    lmcache_ec_bytes_out_total              tensor bytes returned by get
    lmcache_ec_integrity_failures_total     entries dropped for failing verification
    lmcache_ec_tier_errors_total{tier}      tier operations that failed (disk I/O, remote)
    lmcache_ec_tier_available{tier}         1 while a disk or remote tier works
    lmcache_ec_feature_off{feature,reason}  1 while a feature is off for want of a
                                            private runtime directory (runtime_dirs.py)
    lmcache_ec_get_latency_seconds          histogram of get (load) latency
    lmcache_ec_put_latency_seconds          histogram of put (save hand-off) latency

Usage::

    server, thread = start_http_server(cache, port=9400)   # GET /metrics
    ...
    server.shutdown()

Inside vLLM the connector reports the same snapshot through vLLM's EC
connector stats hooks instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import start_http_server as _start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

PREFIX = "lmcache_ec"
LABELS = ("model", "namespace")

# (snapshot field, metric name, help)
_COUNTERS = (
    ("misses", "misses", "Gets that found nothing usable in any tier."),
    ("puts", "puts", "Entries accepted by put."),
    ("put_skipped_existing", "put_skipped_existing", "Puts of entries already in the CPU tier."),
    ("put_rejected", "put_rejected", "Puts not stored: CPU pool full, or node tier write failed."),
    ("bytes_in", "bytes_in", "Frame bytes accepted by put."),
    ("bytes_out", "bytes_out", "Tensor bytes returned by get."),
    ("integrity_failures", "integrity_failures", "Entries dropped for failing verification."),
)


class ECStatsCollector(Collector):
    """A Prometheus collector over one or more ``ECCache`` objects."""

    def __init__(self, caches: Iterable[Any] = ()) -> None:
        self._lock = threading.Lock()
        self._caches: list[Any] = list(caches)

    def add(self, cache: Any) -> None:
        with self._lock:
            self._caches.append(cache)

    def remove(self, cache: Any) -> None:
        with self._lock:
            self._caches = [c for c in self._caches if c is not cache]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            caches = list(self._caches)
        hits = CounterMetricFamily(
            f"{PREFIX}_hits", "Gets answered, by tier.", labels=[*LABELS, "tier"]
        )
        errors = CounterMetricFamily(
            f"{PREFIX}_tier_errors",
            "Tier operations that failed (disk I/O errors, remote errors), by tier.",
            labels=[*LABELS, "tier"],
        )
        available = GaugeMetricFamily(
            f"{PREFIX}_tier_available",
            "1 while a tier works (remote: answers; disk: its last write succeeded), else 0.",
            labels=[*LABELS, "tier"],
        )
        features_off = GaugeMetricFamily(
            f"{PREFIX}_feature_off",
            "1 while a feature is off: node_tier, shared_ledger (no private runtime "
            "directory), disk_tier (its directory unusable).",
            labels=[*LABELS, "feature", "reason"],
        )
        counters = {
            field: CounterMetricFamily(f"{PREFIX}_{name}", text, labels=list(LABELS))
            for field, name, text in _COUNTERS
        }
        histograms = {
            field: HistogramMetricFamily(f"{PREFIX}_{field}_seconds", text, labels=list(LABELS))
            for field, text in (
                ("get_latency", "Latency of get (tier walk, verification, copy out)."),
                ("put_latency", "Latency of put up to the hand-off to the CPU tier."),
            )
        }
        for cache in caches:
            labels = [cache.identity.model, cache.identity.namespace]
            snap = cache.stats.snapshot()
            for tier in cache.tiers:
                hits.add_metric([*labels, tier], snap["hits"].get(tier, 0))
            for tier, count in snap["hits"].items():
                if tier not in cache.tiers:
                    hits.add_metric([*labels, tier], count)
            for tier, count in snap["tier_errors"].items():
                errors.add_metric([*labels, tier], count)
            for tier, state in snap["tiers"].items():
                available.add_metric([*labels, tier], float(bool(state.get("available"))))
            for feature, reason in snap["features_off"].items():
                features_off.add_metric([*labels, feature, reason], 1.0)
            for field, family in counters.items():
                family.add_metric(labels, snap[field])
            for field, family in histograms.items():
                hist = snap[field]
                buckets = [(_le(bound), count) for bound, count in hist["buckets"]]
                family.add_metric(labels, buckets, hist["sum"])
        yield hits
        yield errors
        yield available
        yield features_off
        yield from counters.values()
        yield from histograms.values()


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def register(caches: Any | Iterable[Any], registry: CollectorRegistry) -> ECStatsCollector:
    """Register a collector for ``caches`` (one cache or several) on ``registry``."""
    collector = ECStatsCollector(_as_list(caches))
    registry.register(collector)
    return collector


def start_http_server(
    caches: Any | Iterable[Any],
    port: int = 9400,
    addr: str = "127.0.0.1",
    registry: CollectorRegistry | None = None,
) -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` for ``caches`` on ``addr:port`` (``port=0``: any free port).

    Uses a private registry unless one is given, so several servers (or tests)
    never collide on the global one. Returns ``(server, thread)``; the bound
    port is ``server.server_port``; stop with ``server.shutdown()``.
    """
    registry = CollectorRegistry(auto_describe=True) if registry is None else registry
    register(caches, registry)
    return _start_http_server(port, addr=addr, registry=registry)


def _as_list(caches: Any | Iterable[Any]) -> list[Any]:
    if hasattr(caches, "stats") and hasattr(caches, "identity"):
        return [caches]
    return list(caches)


__all__ = ["ECStatsCollector", "register", "start_http_server"]
