"""vLLM connector stats and Prometheus metrics of the encoder tier.

Counters travel as flat ``{name: number}`` dicts: workers send deltas in
their step metadata (so they reach the scheduler under both model runners),
the scheduler adds its own (``scheduler_*``) and returns the sum from
``get_ec_connector_stats``; vLLM aggregates, logs ``reduce()`` and feeds
``observe`` of the Prometheus metrics.

Worker counters: ``hits_<tier>``, ``misses``, ``bytes_out`` (loaded),
``bytes_in`` (saved frames), ``get_seconds`` / ``put_seconds`` (tier time),
``loads``, ``load_seconds`` (placing a step's loads), ``stage_seconds``,
``stage_room_waits``, ``stage_wrong_rows``,
``saves_submitted``, ``saves_dropped`` (queue full, or the host copy failed), ``save_failures``,
``save_handoff_seconds`` (time inside ``save_caches``), ``integrity_failures``,
``tier_errors_<tier>``, and the worker's end of the stage channel:
``channel_slow_links``, ``channel_bad_frames``, ``channel_refused_links``,
``channel_accept_errors``. Scheduler counters: ``scheduler_lookups``,
``scheduler_lookup_hits``, ``scheduler_stage_orders``,
``scheduler_stage_given_up``, ``scheduler_deferred_steps``,
``scheduler_channel_breaks``, ``scheduler_channel_bad_frames``,
``scheduler_encoder_cache_resets``, ``scheduler_stale_items``,
``scheduler_rows_mismatch_requests``.

Features off travel the same way, as ``feature_off:<feature>:<reason>``
changes (``features_off.py``): +1 when a process (the scheduler, a worker
rank) turns one off, -1 when it is back. The scheduler's connector hands on
their running sum instead, the level, whenever it changes; the gauge
``vllm:lmcache_ec_feature_off{feature,reason}`` is set to it: the engine's
processes that have the feature off now. Counters only ever grow: a negative
value is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.ec_transfer.ec_connector.metrics import (
    ECConnectorPromMetrics,
    ECConnectorStats,
)

from .features_off import is_off_key


def flat_counters(snapshot: dict[str, Any]) -> dict[str, float]:
    """A cache's ``stats.snapshot()`` as the flat counters a worker reports."""
    flat: dict[str, float] = {}
    for name, value in snapshot.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            flat[name] = value
        elif name in ("hits", "tier_errors") and isinstance(value, dict):
            for tier, count in value.items():
                flat[f"{name}_{tier}"] = count
    flat.pop("hit_rate", None)
    return flat


@dataclass
class ECTierConnectorStats(ECConnectorStats):
    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: ECConnectorStats) -> ECTierConnectorStats:
        merged = dict(self.data)
        for name, value in (other.data or {}).items():
            merged[name] = value if is_off_key(name) else merged.get(name, 0) + value
        return ECTierConnectorStats(data=merged)

    def reduce(self) -> dict[str, int | float]:
        data = dict(self.data)
        hits = sum(v for k, v in data.items() if k.startswith("hits_"))
        lookups = hits + data.get("misses", 0)
        data["hit_rate"] = round(hits / lookups, 4) if lookups else 0.0
        if data.get("loads"):
            data["avg_load_ms"] = round(1000 * data.get("load_seconds", 0) / data["loads"], 4)
        saves = data.get("saves_submitted", 0) + data.get("saves_dropped", 0)
        if saves:
            data["avg_save_handoff_ms"] = round(
                1000 * data.get("save_handoff_seconds", 0) / saves, 4
            )
        if data.get("puts"):
            data["avg_put_ms"] = round(1000 * data.get("put_seconds", 0) / data["puts"], 4)
        return data

    def is_empty(self) -> bool:  # a feature back on is news: its level is 0
        return not any(value or is_off_key(name) for name, value in self.data.items())


# Prometheus counter name suffix -> data keys summed into it.
_COUNTERS: dict[str, tuple[str, str]] = {
    "misses": ("misses", "Encoder-output reads that found nothing usable"),
    "bytes_loaded": ("bytes_out", "Encoder-output bytes read from the tiers"),
    "bytes_saved": ("bytes_in", "Encoder-output frame bytes written to the tiers"),
    "loads": ("loads", "Encoder outputs placed into vLLM's encoder cache"),
    "load_seconds": ("load_seconds", "Seconds spent placing loads before the encoder"),
    "read_seconds": ("get_seconds", "Seconds spent reading the tiers (staging)"),
    "saves": ("saves_submitted", "Saves handed to the background writer"),
    "saves_dropped": (
        "saves_dropped",
        "Saves dropped: write queue full, or host copy failed",
    ),
    "save_handoff_seconds": ("save_handoff_seconds", "Seconds spent inside save_caches"),
    "write_seconds": ("put_seconds", "Seconds the background writer spent in put"),
    "purges_seen": (
        "purges_seen",
        "Purges by another process (lmcache-ec purge) the engine's workers applied",
    ),
    "lookups": ("scheduler_lookups", "Scheduler has_cache_item calls"),
    "lookup_hits": ("scheduler_lookup_hits", "Scheduler has_cache_item hits"),
    "channel_slow_links": (
        "channel_slow_links",
        "Stage-channel links a worker dropped because the peer stopped reading",
    ),
    "channel_bad_frames": (
        "channel_bad_frames",
        "Stage-channel links a worker closed for a bad, oversized or stalled frame",
    ),
    "channel_refused_links": (
        "channel_refused_links",
        "Stage-channel connections a worker refused (link limit reached)",
    ),
    "channel_accept_errors": (
        "channel_accept_errors",
        "Stage-channel accepts that failed (out of descriptors or memory); retried",
    ),
    "scheduler_channel_breaks": (
        "scheduler_channel_breaks",
        "Times the scheduler's stage channel broke; orders go with step metadata",
    ),
    "scheduler_channel_bad_frames": (
        "scheduler_channel_bad_frames",
        "Bad, oversized or stalled frames the scheduler received from a worker",
    ),
}


class ECTierPromMetrics(ECConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[str, dict[int, Any]] = {}
        for suffix, (_, doc) in _COUNTERS.items():
            metric = self._counter_cls(
                name=f"vllm:lmcache_ec_{suffix}", documentation=doc, labelnames=labelnames
            )
            self._counters[suffix] = {
                engine: metric.labels(*values) for engine, values in per_engine_labelvalues.items()
            }
        hits = self._counter_cls(
            name="vllm:lmcache_ec_hits",
            documentation="Encoder-output reads answered, by tier",
            labelnames=[*labelnames, "tier"],
        )
        self._hits = hits
        self._features_off = self._gauge_cls(
            name="vllm:lmcache_ec_feature_off",
            documentation="Processes of the engine (scheduler, worker ranks) with a feature "
            "off, and why (node_tier, shared_ledger, stage_channel: no private runtime "
            "directory; disk_tier: its directory unusable; caching: the encoder weights "
            "are not known)",
            labelnames=[*labelnames, "feature", "reason"],
            multiprocess_mode="mostrecent",  # the level a front-end was last handed
        )
        self._labelvalues = per_engine_labelvalues

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for suffix, (key, _) in _COUNTERS.items():
            value = transfer_stats_data.get(key, 0)
            if value > 0:  # prometheus raises on a negative increment
                self._counters[suffix][engine_idx].inc(value)
        for key, value in transfer_stats_data.items():
            if key.startswith("hits_") and value > 0:
                tier = key[len("hits_") :]
                self._hits.labels(*self._labelvalues[engine_idx], tier).inc(value)
            elif is_off_key(key) and key.count(":") == 2:
                _, feature, reason = key.split(":")
                labels = (*self._labelvalues[engine_idx], feature, reason)
                self._features_off.labels(*labels).set(value)
