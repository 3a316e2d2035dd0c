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

or ``register(cache, registry)`` on a registry served already, once per cache:
each registry gets one collector, which the later calls add their caches to.
Caches of one ``(model, namespace)`` (two dtypes, two weights versions) make
one series per label set, summed (``tier_available``: 0 while the tier fails
in any of them), as Prometheus takes no repeated series.

Inside vLLM the connector reports the same snapshot through vLLM's EC
connector stats hooks instead.
"""

from __future__ import annotations

import threading
import weakref
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

_HISTOGRAMS = (  # (snapshot field, help): metric {PREFIX}_{field}_seconds
    ("get_latency", "Latency of get (tier walk, verification, copy out)."),
    ("put_latency", "Latency of put up to the hand-off to the CPU tier."),
)

Labels = tuple[str, ...]


class _Totals:
    """Every cache's snapshot merged per label set: caches of one ``(model,
    namespace)`` (two dtypes, two weights versions) make one series each, as
    Prometheus requires. Counters and histograms are summed; ``tier_available``
    is the least (0 while the tier fails in any of them); ``feature_off`` is 1
    while the feature is off in any."""

    def __init__(self) -> None:
        self.hits: dict[Labels, float] = {}
        self.errors: dict[Labels, float] = {}
        self.available: dict[Labels, float] = {}
        self.features_off: dict[Labels, float] = {}
        self.counters: dict[str, dict[Labels, float]] = {field: {} for field, _, _ in _COUNTERS}
        # field -> labels -> ({upper bound: cumulative count}, sum). Every ECStats
        # histogram has metrics.LATENCY_BUCKETS, so the counts at a bound add up.
        self.histograms: dict[str, dict[Labels, tuple[dict[float, float], float]]] = {
            field: {} for field, _ in _HISTOGRAMS
        }

    def add(self, cache: Any) -> None:
        labels = (cache.identity.model, cache.identity.namespace)
        snap = cache.stats.snapshot()
        for tier in dict.fromkeys((*cache.tiers, *snap["hits"])):  # a 0 before a tier's hit
            _add(self.hits, (*labels, tier), snap["hits"].get(tier, 0))
        for tier, count in snap["tier_errors"].items():
            _add(self.errors, (*labels, tier), count)
        for tier, state in snap["tiers"].items():
            up = float(bool(state.get("available")))
            self.available[(*labels, tier)] = min(up, self.available.get((*labels, tier), up))
        for feature, reason in snap["features_off"].items():
            self.features_off[(*labels, feature, reason)] = 1.0
        for field, series in self.counters.items():
            _add(series, labels, snap[field])
        for field, series in self.histograms.items():
            buckets, total = series.get(labels, ({}, 0.0))
            for bound, count in snap[field]["buckets"]:
                buckets[bound] = buckets.get(bound, 0) + count
            series[labels] = (buckets, total + snap[field]["sum"])

    def families(self) -> Iterator[Metric]:
        yield _family(
            CounterMetricFamily(
                f"{PREFIX}_hits", "Gets answered, by tier.", labels=[*LABELS, "tier"]
            ),
            self.hits,
        )
        yield _family(
            CounterMetricFamily(
                f"{PREFIX}_tier_errors",
                "Tier operations that failed (disk I/O errors, remote errors), by tier.",
                labels=[*LABELS, "tier"],
            ),
            self.errors,
        )
        yield _family(
            GaugeMetricFamily(
                f"{PREFIX}_tier_available",
                "1 while a tier works (remote: answers; disk: its last write succeeded), else 0.",
                labels=[*LABELS, "tier"],
            ),
            self.available,
        )
        yield _family(
            GaugeMetricFamily(
                f"{PREFIX}_feature_off",
                "1 while a feature is off: node_tier, shared_ledger (no private runtime "
                "directory), disk_tier (its directory unusable).",
                labels=[*LABELS, "feature", "reason"],
            ),
            self.features_off,
        )
        for field, name, text in _COUNTERS:
            family = CounterMetricFamily(f"{PREFIX}_{name}", text, labels=list(LABELS))
            yield _family(family, self.counters[field])
        for field, text in _HISTOGRAMS:
            histogram = HistogramMetricFamily(
                f"{PREFIX}_{field}_seconds", text, labels=list(LABELS)
            )
            for labels, (buckets, total) in self.histograms[field].items():
                histogram.add_metric(
                    list(labels), [(_le(b), count) for b, count in buckets.items()], total
                )
            yield histogram


def _add(series: dict[Labels, float], labels: Labels, value: float) -> None:
    series[labels] = series.get(labels, 0) + value


def _family(family: Any, series: dict[Labels, float]) -> Any:
    for labels, value in series.items():
        family.add_metric(list(labels), value)
    return family


class ECStatsCollector(Collector):
    """A Prometheus collector over one or more ``ECCache`` objects: one series
    per label set, however many caches share it (``_Totals``)."""

    def __init__(self, caches: Iterable[Any] = ()) -> None:
        self._lock = threading.Lock()
        self._caches: list[Any] = []
        for cache in caches:
            self.add(cache)

    def add(self, cache: Any) -> None:
        """Export ``cache`` too (once: adding it again changes nothing)."""
        with self._lock:
            if not any(c is cache for c in self._caches):
                self._caches.append(cache)

    def remove(self, cache: Any) -> None:
        with self._lock:
            self._caches = [c for c in self._caches if c is not cache]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            caches = list(self._caches)
        totals = _Totals()
        for cache in caches:
            totals.add(cache)
        yield from totals.families()


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


# The collector registered on each registry: a second one would repeat every
# family name, which a registry refuses ("Duplicated timeseries") or, without
# auto_describe, writes twice. Weak: a registry dropped takes its entry along.
_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, ECStatsCollector] = (
    weakref.WeakKeyDictionary()
)
_COLLECTORS_LOCK = threading.Lock()


def register(caches: Any | Iterable[Any], registry: CollectorRegistry) -> ECStatsCollector:
    """Export ``caches`` (one cache or several) on ``registry``: the first call
    registers lmcache-ec's collector there, later ones add to it (so a process
    with several caches calls it once per cache). Returns that collector."""
    with _COLLECTORS_LOCK:
        collector = _COLLECTORS.get(registry)
        if collector is None:
            collector = ECStatsCollector(_as_list(caches))
            registry.register(collector)
            _COLLECTORS[registry] = collector
            return collector
    for cache in _as_list(caches):
        collector.add(cache)
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
