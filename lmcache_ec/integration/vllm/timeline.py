"""Per-request timeline of a multimodal request's way to its first token (opt-in).

With ``ec.timeline_path`` set, the scheduler side appends one JSON line per
finished multimodal request, and each worker one line per item it staged or
loaded, to that file (``O_APPEND``: one ``write`` per line, so processes
never interleave within a line). Times are wall-clock seconds
(``time.time()``), so they line up with vLLM's ``Request.arrival_time`` and
with a client's own clock on the same machine. Events, in the order a tier
hit passes them::

  request  arrival      vLLM's Request.arrival_time (the API server got it)
           seen         the first schedule() that asked about it
  item     lookup       the tiers' answer (found or not)
           stage_sent   the stage order queued for the workers
           staged       every rank's answer applied: the load can be promised
           scheduled    scheduled with its load (update_state_after_alloc)
           read         (worker) the staging read done
           loaded       (worker) placed into vLLM's encoder cache

Scheduler line: ``{"request": id, "arrival": t, "seen": t, "items": {id:
{event: t}}}``; worker line: ``{"item": id, "rank": r, "read"|"loaded": t}``.
An item's events restart at each lookup; only those at or after ``seen``
are written for a request. Cost: a dict write per event; one ``write`` per
finished request and per worker read or load; nothing when unset.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import OrderedDict
from typing import Any

logger = logging.getLogger(__name__)

_ITEMS_KEPT = 4096  # item records kept for requests still running (oldest dropped)
_REQUESTS_KEPT = 4096


class TimelineWriter:
    """Appends one JSON object per line to ``path``; a failed write is logged once."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._failed = False

    def write(self, record: dict[str, Any]) -> None:
        if self._failed:
            return
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(self._fd, line)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
            self._failed = True
            logger.warning("Timeline off: cannot write %s (%s)", self.path, exc)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class SchedulerTimeline:
    """The scheduler's events, written when a request finishes."""

    def __init__(self, path: str) -> None:
        self._writer = TimelineWriter(path)
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._items: OrderedDict[str, dict[str, float]] = OrderedDict()

    def seen(self, request_id: str) -> None:
        if request_id not in self._seen:
            self._seen[request_id] = time.time()
            if len(self._seen) > _REQUESTS_KEPT:
                self._seen.popitem(last=False)

    def item(self, identifier: str, event: str) -> None:
        """``event`` happened to ``identifier`` now (a lookup starts its record afresh)."""
        record = self._items.get(identifier)
        if record is None or event == "lookup":
            record = self._items[identifier] = {}
            if len(self._items) > _ITEMS_KEPT:
                self._items.popitem(last=False)
        record.setdefault(event, time.time())

    def finished(self, request: Any) -> None:
        """Write ``request``'s line (multimodal requests the scheduler saw only)."""
        seen = self._seen.pop(request.request_id, None)
        if seen is None:
            return
        items = {}
        for feature in request.mm_features or ():
            events = self._items.get(feature.identifier, {})
            items[feature.identifier] = {k: t for k, t in events.items() if t >= seen}
        self._writer.write(
            {
                "request": request.request_id,
                "arrival": request.arrival_time,
                "seen": seen,
                "items": items,
            }
        )

    def close(self) -> None:
        self._writer.close()


class WorkerTimeline:
    """A worker's events, one line each."""

    def __init__(self, path: str, rank: int) -> None:
        self._writer = TimelineWriter(path)
        self.rank = rank

    def item(self, identifier: str, event: str, at: float | None = None) -> None:
        """``event`` happened to ``identifier`` at ``at`` (default: now)."""
        when = time.time() if at is None else at
        self._writer.write({"item": identifier, "rank": self.rank, event: when})

    def close(self) -> None:
        self._writer.close()


__all__ = ["SchedulerTimeline", "TimelineWriter", "WorkerTimeline"]
