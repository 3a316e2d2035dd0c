"""Features off, as the counters the connector reports.

Each process (the scheduler, a worker rank) reports the features it has off
(``runtime_dirs.Feature``, or caching paused) as ``feature_off:<feature>:<reason>``
deltas: +1 when it turns one off, -1 when it is back. Their running sum, the
number of the engine's processes that have it off now, is kept where every
change meets, in the engine core (``OffLevels``), and handed on as that level
(``stats.py``: the gauge ``vllm:lmcache_ec_feature_off{feature,reason}``): vLLM
gives a step's stats to one of its front-ends only, so a sum kept in a
front-end would miss the changes another one got. No vLLM import: the worker
side uses it outside vLLM too.
"""

from __future__ import annotations

from collections.abc import Mapping

FEATURE_OFF = "feature_off"


def off_key(feature: str, reason: str) -> str:
    return f"{FEATURE_OFF}:{feature}:{reason}"


class OffChanges:
    """One process's features off, reported as changes since its last report."""

    def __init__(self) -> None:
        self._reported: set[str] = set()

    def take(self, off: Mapping[str, str]) -> dict[str, float]:
        """``off`` (feature -> reason) as deltas against the last call."""
        now = {off_key(feature, reason) for feature, reason in off.items()}
        changes = {key: 1.0 for key in now - self._reported}
        changes.update({key: -1.0 for key in self._reported - now})
        self._reported = now
        return changes


def is_off_key(name: str) -> bool:
    return name.startswith(FEATURE_OFF + ":")


class OffLevels:
    """The engine's features off: the running sum of every process's changes."""

    def __init__(self) -> None:
        self._levels: dict[str, float] = {}

    def apply(self, stats: dict[str, float]) -> dict[str, float]:
        """``stats`` with each feature-off change replaced by the level it leads to."""
        for name, change in stats.items():
            if is_off_key(name):
                level = max(0.0, self._levels.get(name, 0.0) + change)
                self._levels[name] = stats[name] = level
        return stats
