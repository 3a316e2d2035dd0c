"""The purge marker: how ``lmcache-ec purge`` reaches engines that are running.

``purge`` deletes entries from the disk and remote tiers, then writes one small
JSON record — a *generation* — to each tier it purged:

- disk: the file ``<local_disk>/ec-purge-generation.json`` (written to a
  temporary name and renamed, see ``tiers/disk_layout.py``). It is not an
  entry's file name, so the disk tier, ``ls``, ``stats`` and ``purge`` never
  take it for an entry;
- remote: the key (Redis) or object (S3, under the prefix)
  ``ec-purge-generation.json``, which is not a storage name (those start with
  ``ec1.``), so listings skip it. Readers of the store keep it recently used.

A record is ``{"v": 1, "generation": <random hex>, "time": <epoch seconds>,
"select": {"namespace", "model", "weights", "older_than"}}``; an empty
selection field matches everything.

``MarkerWatch`` notices a generation it has not seen: a ``stat`` of the disk
file at most every ``interval`` seconds on the caller's path (``poll_disk``),
and a read of the remote record wherever its owner does remote work
(``check_remote``). A record present at start is old news unless written
after the watch started; one generation seen on both tiers counts once.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .selection import Selector

logger = logging.getLogger(__name__)

MARKER_NAME = "ec-purge-generation.json"  # disk file name, Redis key, S3 object name
FORMAT_VERSION = 1
_MAX_BYTES = 64 * 1024
_REMEMBERED = 64  # generations remembered as handled


@dataclass(frozen=True)
class PurgeMarker:
    generation: str
    time: float  # when the purge finished deleting (epoch seconds, purger's clock)
    select: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def new(cls, selector: Selector) -> PurgeMarker:
        select = {
            "namespace": selector.namespace,
            "model": selector.model,
            "weights": selector.weights,
            "older_than": selector.older_than,
        }
        return cls(secrets.token_hex(16), time.time(), select)

    def selector(self) -> Selector:
        """What the purge selected, as of its time: entries created before it
        (``--older-than`` moves that cut-off back), so applying it later never
        selects entries written after the purge."""
        get = self.select.get
        older = get("older_than")
        return Selector(
            namespace=get("namespace"),
            model=get("model"),
            weights=get("weights"),
            created_before=self.time - (float(older) if older is not None else 0.0),
        )

    def to_bytes(self) -> bytes:
        record = {
            "v": FORMAT_VERSION,
            "generation": self.generation,
            "time": self.time,
            "select": self.select,
        }
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PurgeMarker | None:
        """The record in ``data``; None if it is not one (never raises)."""
        try:
            record = json.loads(data[:_MAX_BYTES])
            select = record.get("select") or {}
            if not isinstance(select, dict):
                select = {}
            select = {
                "namespace": _text(select.get("namespace")),
                "model": _text(select.get("model")),
                "weights": _text(select.get("weights")),
                "older_than": _number(select.get("older_than")),
            }
            return cls(str(record["generation"]), float(record["time"]), select)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and value == value and value >= 0 else None


# -- disk ----------------------------------------------------------------------


def disk_path(directory: str) -> str:
    return os.path.join(directory, MARKER_NAME)


def write_disk(directory: str, marker: PurgeMarker) -> None:
    """Write the record atomically (temporary file + rename); raises ``OSError``."""
    from .tiers.disk_layout import DirectoryLayout

    DirectoryLayout(directory).replace_file(MARKER_NAME, marker.to_bytes())


def disk_signature(directory: str) -> tuple[int, int, int] | None:
    """(inode, mtime ns, size) of the disk record, None if there is none."""
    try:
        stat = os.stat(disk_path(directory))
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def read_disk(directory: str) -> PurgeMarker | None:
    try:
        with open(disk_path(directory), "rb") as stream:
            return PurgeMarker.from_bytes(stream.read(_MAX_BYTES))
    except OSError:
        return None


# -- remote --------------------------------------------------------------------


def write_remote(catalog: Any, marker: PurgeMarker) -> None:
    """Store the record next to the entries (``RemoteCatalog``); raises on failure."""
    catalog.write_object(MARKER_NAME, marker.to_bytes())


def read_remote(catalog: Any) -> PurgeMarker | None:
    """The stored record, None if there is none; raises if the store fails."""
    data = catalog.read_object(MARKER_NAME)
    return None if data is None else PurgeMarker.from_bytes(data)


# -- watching ------------------------------------------------------------------


class MarkerWatch:
    """Calls ``on_purge(marker, tier)`` once per new purge generation.

    ``poll_disk`` is cheap enough for a hot path: it looks at the clock, and
    at most every ``interval`` seconds ``stat``s the disk record (reading it
    only when it changed). ``check_remote(catalog)`` reads the remote record;
    its owner calls it from a background thread, never from a read.
    """

    def __init__(
        self,
        disk_dir: str | None,
        interval: float,
        on_purge: Callable[[PurgeMarker, str], None],
    ) -> None:
        self.disk_dir = disk_dir
        self.interval = interval
        self._on_purge = on_purge
        self._started = time.time()
        self._lock = threading.Lock()
        self._handled: deque[str] = deque(maxlen=_REMEMBERED)
        self._next_disk = 0.0
        self._disk_signature: tuple[int, int, int] | None = None
        self.remote_checked = False  # a first answer of the store came in
        if disk_dir is not None:
            self._disk_signature = disk_signature(disk_dir)
            marker = read_disk(disk_dir) if self._disk_signature is not None else None
            if marker is not None:
                self._handled.append(marker.generation)  # a purge before we started

    def poll_disk(self, now: float | None = None) -> bool:
        """Check the disk record if ``interval`` has passed; True if a purge was handled."""
        if self.disk_dir is None:
            return False
        now = time.monotonic() if now is None else now
        if now < self._next_disk:
            return False
        self._next_disk = now + self.interval
        signature = disk_signature(self.disk_dir)
        if signature is None or signature == self._disk_signature:
            return False
        self._disk_signature = signature
        marker = read_disk(self.disk_dir)
        return marker is not None and self._seen(marker, "disk", first=False)

    def check_remote(self, catalog: Any) -> bool:
        """Read the remote record; True if a purge was handled. Store failures are
        logged at debug level and change nothing (the next check asks again)."""
        try:
            marker = read_remote(catalog)
        except Exception as exc:
            logger.debug("Reading the remote purge marker failed: %s", exc)
            return False
        first = not self.remote_checked
        self.remote_checked = True
        return marker is not None and self._seen(marker, "remote", first)

    def _seen(self, marker: PurgeMarker, tier: str, first: bool) -> bool:
        with self._lock:
            if marker.generation in self._handled:
                return False
            self._handled.append(marker.generation)
        if first and marker.time < self._started:
            return False  # there before we started: nothing of ours to drop
        logger.info(
            "Purge %s seen on the %s tier (selection %s); dropping cached copies",
            marker.generation[:8],
            tier,
            {k: v for k, v in marker.select.items() if v is not None} or "all",
        )
        self._on_purge(marker, tier)
        return True
