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

The file must be a regular file: a FIFO, a device or anything else that could
block the engine step writing to it turns the timeline off with one warning,
as does any failed write. A file renamed away (logrotate's ``create`` mode) is
noticed within ``REOPEN_CHECK_S`` and the path opened afresh.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from typing import Any

logger = logging.getLogger(__name__)

_ITEMS_KEPT = 4096  # item records kept for requests still running (oldest dropped)
_REQUESTS_KEPT = 4096
REOPEN_CHECK_S = 1.0  # how often the path is compared with the open file (rotation)
# O_NONBLOCK: opening a FIFO without a reader fails at once (ENXIO) instead of waiting.
_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK


class TimelineWriter:
    """Appends one JSON object per line to ``path`` (a regular file); a failed
    write, or a path that is no regular file, turns it off with one warning.

    Called from the engine's step threads: it never waits on a reader, and a
    lock keeps two threads from opening the file twice."""

    def __init__(self, path: str, reopen_check_s: float = REOPEN_CHECK_S) -> None:
        self.path = path
        self.reopen_check_s = reopen_check_s
        self._fd: int | None = None
        self._failed = False
        self._lock = threading.Lock()
        self._checked_at = 0.0  # time.monotonic() of the last rotation check

    def write(self, record: dict[str, Any]) -> None:
        if self._failed:
            return
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._failed:
                return
            try:
                if self._fd is not None and self._rotated():
                    self._close()
                if self._fd is None:
                    self._fd = self._open()
                os.write(self._fd, line)
            except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
                self._failed = True
                self._close()
                logger.warning("Timeline off: cannot write %s (%s)", self.path, exc)

    def _open(self) -> int:
        """The file, opened for appending; OSError if it is no regular file."""
        try:
            fd = os.open(self.path, _OPEN_FLAGS, 0o600)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # O_NONBLOCK's answer for a FIFO without a reader
                raise OSError("not a regular file (a FIFO with no reader)") from exc
            raise
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):  # a write to it could block the engine step
                raise OSError(f"not a regular file ({_kind(mode)})")
        except BaseException:
            os.close(fd)
            raise
        self._checked_at = time.monotonic()
        return fd

    def _rotated(self) -> bool:
        """Whether ``path`` names another file than the open one (checked every
        ``reopen_check_s``): renamed away, or removed."""
        now = time.monotonic()
        if now - self._checked_at < self.reopen_check_s:
            return False
        self._checked_at = now
        assert self._fd is not None
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return True
        opened = os.fstat(self._fd)
        return (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        with self._lock:
            self._close()


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return f"mode {stat.S_IFMT(mode):o}"


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
