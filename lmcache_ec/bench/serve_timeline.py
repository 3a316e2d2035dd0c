"""Per-hit timelines for ``bench serve``: the servers' timeline files joined with
the client's own times (see ``integration/vllm/timeline.py`` for the events).

A request's events, in order: ``sent`` (the client), ``arrival`` (vLLM's
API server), ``seen`` (first schedule() that asked about it), ``lookup``,
``stage_sent``, ``read`` (worker), ``staged``, ``scheduled`` (with its
load), ``loaded`` (worker), ``first_token`` (the client). A subject records
only some (ECExampleConnector: no staging); an interval is taken between
consecutive events the request has. Nothing here measures.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

EVENTS = (
    "sent",
    "arrival",
    "seen",
    "lookup",
    "stage_sent",
    "read",
    "staged",
    "scheduled",
    "loaded",
    "first_token",
)
WORKER_EVENTS = ("read", "loaded")


@dataclass
class TimelineFile:
    """What one server wrote: request records by the client's request id, and
    the workers' event times by item."""

    requests: dict[str, dict] = field(default_factory=dict)
    items: dict[str, dict[str, list[float]]] = field(default_factory=dict)


def parse_lines(lines: Iterable[str]) -> TimelineFile:
    """Parse timeline lines; a line that is not a record (cut short, say) is skipped."""
    parsed = TimelineFile()
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "request" in record:
            # vLLM's internal id is the client's id plus "-" and 8 characters.
            parsed.requests[str(record["request"]).rsplit("-", 1)[0]] = record
        elif "item" in record:
            events = parsed.items.setdefault(str(record["item"]), {})
            for name in WORKER_EVENTS:
                if isinstance(record.get(name), (int, float)):
                    events.setdefault(name, []).append(float(record[name]))
    return parsed


def read_timeline(path: Path) -> TimelineFile:
    try:
        return parse_lines(path.read_text(errors="replace").splitlines())
    except FileNotFoundError:
        return TimelineFile()


def request_events(
    timeline: TimelineFile, request_id: str | None, sent: float, first_token: float
) -> dict[str, float]:
    """The request's events (absolute times); only the client's two if the
    server wrote nothing for it. A worker event counts only between the request's
    ``seen`` and its first token: the workers write events by item, not by request."""
    events = {"sent": sent, "first_token": first_token}
    record = timeline.requests.get(request_id or "")
    if record is None:
        return events
    seen = float(record["seen"])
    events["arrival"] = float(record["arrival"])
    events["seen"] = seen
    for identifier, item_events in (record.get("items") or {}).items():
        found = {name: float(t) for name, t in item_events.items() if name in EVENTS}
        for name in WORKER_EVENTS:  # the item's first while the request was in flight:
            # a later request for the same image wrote its own after this one's first token.
            during = [
                t
                for t in timeline.items.get(identifier, {}).get(name, [])
                if seen <= t <= first_token
            ]
            if during:
                found[name] = min(during)
        for name, t in found.items():  # a request waits for its last item
            events[name] = max(events.get(name, t), t)
    return events


def intervals(events: dict[str, float]) -> dict[str, float]:
    """Seconds between consecutive events present, named ``a→b``."""
    present = [name for name in EVENTS if name in events]
    return {f"{a}→{b}": events[b] - events[a] for a, b in itertools.pairwise(present)}


def summarize_intervals(per_request: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Median and p99 (ms) of each interval over the requests that have it, in event order."""
    names: dict[str, list[float]] = {}
    for request in per_request:
        for name, seconds in request.items():
            names.setdefault(name, []).append(seconds)
    order = {f"{a}→{b}": (EVENTS.index(a), EVENTS.index(b)) for a in EVENTS for b in EVENTS}
    return {
        name: {
            "p50_ms": round(float(np.percentile(values, 50)) * 1000, 3),
            "p99_ms": round(float(np.percentile(values, 99)) * 1000, 3),
            "n": len(values),
        }
        for name, values in sorted(names.items(), key=lambda kv: order.get(kv[0], (99, 99)))
    }


__all__ = [
    "EVENTS",
    "TimelineFile",
    "intervals",
    "parse_lines",
    "read_timeline",
    "request_events",
    "summarize_intervals",
]
