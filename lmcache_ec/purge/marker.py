"""The purge log: how ``lmcache-ec purge`` reaches engines that are running.

``purge`` deletes entries from the disk and remote tiers, then appends one
record, a *generation*, to the purge log of every namespace it purged, on each
tier it purged:

- one log per namespace, ``ec-purge.<namespace slug>.log``: a file in the disk
  directory, a key (Redis) or an object (S3, under the prefix) beside the
  entries. It is no entry's name, so listings and purges never take it for one;
- append-only, so no purge is lost however many are made at once, by any
  number of tenants or several in one namespace: Redis appends in one script
  (``APPEND``, then trim), S3 by a conditional put on the ETag it read
  (retried when another purge got in first), the disk under a lock on the
  directory (the new log is written aside and renamed into place). A log keeps
  its newest records within ``LOG_LIMIT`` bytes: 260 typical records, never
  fewer than ``LOG_LIMIT // RECORD_LIMIT``.

A record is one line of JSON, ``{"v": 1, "generation": <hex>, "time": <epoch
seconds>, "select": {"namespace", "model", "weights", "older_than"}}``; an
absent or null selection field matches everything of the log's namespace.

Records are untrusted: anyone who can write to a store can write one. A reader

- reads at most ``LOG_LIMIT + 1`` bytes, the log's tail, and on disk opens only
  a regular file (no link followed, never blocking on a FIFO);
- rejects a record that is not exactly that schema (sizes, types, a hex
  generation, finite non-negative numbers): logged once, ignored, never raised;
- leaves a record more than ``FUTURE_LIMIT_S`` ahead of its own clock waiting
  (``RecordAhead``: read again at each check, a disk log's too, until this
  clock nears its time), and clamps the time of one less far ahead to it: a
  record from the future selects nothing written after it was read, and is
  not new to every engine started before its time;
- scopes a record to the namespace whose log holds it: one that names another
  namespace is rejected, so no record reaches another tenant's entries (not
  even an engine's own disk and node entries, which only a remote record
  makes it delete).

``MarkerWatch`` notices a generation it has not handled: a ``stat`` of the disk
log at most every ``interval`` seconds on the caller's path (``poll_disk``),
and a read of the remote log wherever its owner does remote work
(``check_remote``). Records written before the watch started are old news;
one generation seen on both tiers counts once. A generation seen again with a
later time (``lmcache-ec purge`` records before and after its deletes) is
applied again, and still counts once (``counts``). A generation whose handler
raises ``PurgeIncomplete`` is forgotten, so the next check applies it again.
A generation is handled from when one thread takes it until its handler
returns: ``wait_applied`` waits for that (a thread about to undo a purge, the
replay of an outage's writes, must not take "seen" for "applied").
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import xxhash

from ..flocks import flock_within
from ..key import slug
from ..remote.store import appended
from ..tiers.disk_layout import PRIVATE, DirectoryLayout, DirectoryModes
from .selection import Selector

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
LOG_PREFIX = "ec-purge."
LOG_SUFFIX = ".log"
LOG_LIMIT = 64 * 1024  # bytes of a log kept, and read
RECORD_LIMIT = 4 * 1024  # bytes of one record (a line)
APPEND_LOCK_S = 10.0  # a purger's wait for another purger's append
_TEXT_LIMIT = 1024  # characters of a namespace, model or weights version
_SELECT_FIELDS = ("namespace", "model", "weights", "older_than")
_RECORD_FIELDS = {"v", "generation", "time", "select"}
_GENERATION = re.compile(r"[0-9a-f]{1,64}")
_SLUG = re.compile(r"[A-Za-z0-9-]{1,64}")  # what ``key.slug`` makes
# How far a record's time may run ahead of the reader's clock: hosts' clocks
# differ by far less under NTP. A record further ahead (a clock set wrong, a
# hostile ``time``) would look new to every engine started before that time,
# each deleting the entries written since the purge: it is rejected.
FUTURE_LIMIT_S = 60.0
# Entries are dated by their writer's clock, a purge by the purger's: an engine
# applying one also takes entries created up to this much after it (a writer's
# clock ahead; the cost: misses of entries written just after a purge).
CLOCK_SKEW_S = FUTURE_LIMIT_S
_REMEMBERED = 4096  # generations remembered as handled (a log holds far fewer)
_REPORTED = 1024  # problems remembered as logged


class BadRecord(ValueError):
    """A purge record that is not one (the message says why)."""


class RecordAhead(BadRecord):
    """A record too far ahead of this clock: taken once the clock is near it."""


class PurgeIncomplete(Exception):
    """``on_purge`` left part of a purge undone (an entry it could not delete):
    the watch forgets the generation, and its next check applies it again."""


def log_name(namespace: str) -> str:
    """The purge log of ``namespace``: a disk file name, Redis key or S3 object name."""
    return log_name_of_slug(slug(namespace))


def log_name_of_slug(namespace_slug: str) -> str:
    return f"{LOG_PREFIX}{namespace_slug}{LOG_SUFFIX}"


@dataclass(frozen=True)
class PurgeMarker:
    """One purge: what it selected, as of when (epoch seconds, purger's clock,
    clamped to the reader's)."""

    generation: str
    time: float
    namespace: str | None = None
    model: str | None = None
    weights: str | None = None
    older_than: float | None = None

    @classmethod
    def new(cls, selector: Selector) -> PurgeMarker:
        return cls(
            secrets.token_hex(16),
            time.time(),
            selector.namespace,
            selector.model,
            selector.weights,
            selector.older_than,
        )

    def selector(self, namespace: str) -> Selector:
        """What the purge selected in ``namespace`` (the log's), as of its time:
        entries created before it, give or take ``CLOCK_SKEW_S`` (``--older-than``
        moves that cut-off back), so applying it later does not select entries
        written well after the purge."""
        return Selector(
            namespace=namespace,
            model=self.model,
            weights=self.weights,
            created_before=self.time + CLOCK_SKEW_S - (self.older_than or 0.0),
        )

    def describe(self) -> str:
        fields = {f: getattr(self, f) for f in _SELECT_FIELDS if getattr(self, f) is not None}
        return str(fields or "all")

    def to_line(self) -> bytes:
        """The record as one log line; ``ValueError`` if a reader would refuse it
        (a text over ``_TEXT_LIMIT`` characters, a line over ``RECORD_LIMIT`` bytes,
        an ``older_than`` that is no finite number of seconds at least 0)."""
        if self.older_than is not None and not (
            math.isfinite(self.older_than) and self.older_than >= 0
        ):
            raise ValueError(f"a purge's older_than must be finite and >= 0, not {self.older_than}")
        for field in ("namespace", "model", "weights"):
            value = getattr(self, field)
            if value is not None and len(value) > _TEXT_LIMIT:
                raise ValueError(f"a purge's {field} is longer than {_TEXT_LIMIT} characters")
        record = {
            "v": FORMAT_VERSION,
            "generation": self.generation,
            "time": self.time,
            "select": {f: getattr(self, f) for f in _SELECT_FIELDS},
        }
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"
        if len(line) > RECORD_LIMIT:
            raise ValueError(f"purge record longer than {RECORD_LIMIT} bytes")
        return line

    @classmethod
    def parse(cls, line: bytes, namespace: str, now: float) -> PurgeMarker:
        """The record in ``line`` from ``namespace``'s log, its time clamped to
        ``now``; ``BadRecord`` for anything else (never another exception)."""
        if len(line) > RECORD_LIMIT:
            raise BadRecord(f"longer than {RECORD_LIMIT} bytes")
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: deep nesting
            raise BadRecord(f"not JSON: {type(exc).__name__}") from None
        if not isinstance(record, dict) or set(record) != _RECORD_FIELDS:
            raise BadRecord("not a purge record")
        if type(record["v"]) is not int or record["v"] != FORMAT_VERSION:
            raise BadRecord("unknown version")
        generation = record["generation"]
        if not isinstance(generation, str) or not _GENERATION.fullmatch(generation):
            raise BadRecord("bad generation")
        select = record["select"]
        if not isinstance(select, dict) or not set(select) <= set(_SELECT_FIELDS):
            raise BadRecord("bad selection")
        texts = {f: _text(select.get(f), f) for f in ("namespace", "model", "weights")}
        if texts["namespace"] is not None and texts["namespace"] != namespace:
            raise BadRecord("it names another namespace than its log's")
        older_than = select.get("older_than")
        when = _seconds(record["time"], "time")
        if when > now + FUTURE_LIMIT_S:
            raise RecordAhead(f"its time is {when - now:.0f} s ahead of this host's clock")
        return cls(
            generation,
            min(when, now),
            texts["namespace"],
            texts["model"],
            texts["weights"],
            None if older_than is None else _seconds(older_than, "older_than"),
        )


def _text(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > _TEXT_LIMIT:
        raise BadRecord(f"bad {name}")
    return value


def _seconds(value: Any, name: str) -> float:
    """A finite, non-negative number of seconds."""
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise BadRecord(f"bad {name}")
    return float(value)


def records(data: bytes) -> list[bytes]:
    """The lines of a log read as its last ``LOG_LIMIT + 1`` bytes (or less): a
    read that got all of them started inside a line, which is dropped."""
    lines = data.split(b"\n")
    if len(data) > LOG_LIMIT:
        lines = lines[1:]
    return [line for line in lines if line.strip()]


# -- disk ----------------------------------------------------------------------


class UnreadableLog(OSError):
    """A disk log that is not a regular file (a link, a FIFO, a directory …)."""


def disk_path(directory: str, namespace: str) -> str:
    return os.path.join(directory, log_name(namespace))


def _read_file(path: str) -> bytes | None:
    """The last ``LOG_LIMIT + 1`` bytes of the regular file ``path`` (None if
    absent), opened without following a link and without blocking (a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnreadableLog(exc.errno, f"cannot open it: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableLog("not a regular file")
        start = max(0, info.st_size - LOG_LIMIT - 1)
        return os.pread(fd, LOG_LIMIT + 1, start)
    finally:
        os.close(fd)


def read_disk(directory: str, namespace: str) -> bytes | None:
    """The tail of ``namespace``'s disk log (``records`` splits it); None if there
    is none; ``OSError`` (``UnreadableLog``) if it cannot be read as a file."""
    return _read_file(disk_path(directory, namespace))


def disk_log_slugs(directory: str) -> set[str]:
    """Slugs of the namespaces with a purge log in ``directory``: those whose
    engines listen there. Empty if it does not exist; ``OSError`` if unlistable."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return set()
    found = set()
    for name in names:
        if name.startswith(LOG_PREFIX) and name.endswith(LOG_SUFFIX):
            namespace_slug = name[len(LOG_PREFIX) : -len(LOG_SUFFIX)]
            if _SLUG.fullmatch(namespace_slug):
                found.add(namespace_slug)
    return found


def disk_signature(directory: str, namespace: str) -> tuple[int, int, int] | None:
    """(inode, mtime ns, size) of the disk log (not following a link), None if none."""
    try:
        info = os.lstat(disk_path(directory, namespace))
    except OSError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)


def append_disk(
    directory: str, namespace_slug: str, line: bytes, modes: DirectoryModes = PRIVATE
) -> None:
    """Append ``line`` to the disk log of the namespace with that slug, under an
    ``flock`` on the directory (purgers queue, each at most ``APPEND_LOCK_S``: a
    stopped purger holds it for good; readers never wait: the new log is
    written aside and renamed into place). Raises ``OSError``."""
    name = log_name_of_slug(namespace_slug)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flock_within(fd, APPEND_LOCK_S, f"the purge logs' directory {directory}")
        try:
            log = _read_file(os.path.join(directory, name)) or b""
        except UnreadableLog as exc:  # replaced below by a good one
            logger.warning("Replacing the unreadable purge log %s: %s", name, exc)
            log = b""
        log = b"".join(record + b"\n" for record in records(log))
        DirectoryLayout(directory, modes).replace_file(name, appended(log, line, LOG_LIMIT))
    finally:
        os.close(fd)  # releases the lock


# -- remote --------------------------------------------------------------------


def append_remote(catalog: Any, namespace_slug: str, line: bytes) -> None:
    """Append ``line`` to the remote log (``RemoteCatalog``); raises on failure."""
    catalog.append_log(log_name_of_slug(namespace_slug), line, LOG_LIMIT)


def read_remote(catalog: Any, namespace: str) -> bytes | None:
    """The tail of the remote log, None if there is none; raises if the store fails."""
    return catalog.read_log(log_name(namespace), LOG_LIMIT + 1)


# -- watching ------------------------------------------------------------------


class MarkerWatch:
    """Calls ``on_purge(marker, tier)`` once per new purge of ``namespace``.

    ``poll_disk`` is cheap enough for a hot path: it looks at the clock, and at
    most every ``interval`` seconds ``lstat``s the disk log (reading it only
    when it changed). ``check_remote(catalog)`` reads the remote log; its owner
    calls it from a background thread, never from a read. Neither raises: a
    log or record that cannot be used, or an ``on_purge`` that fails, is
    logged once and skipped; one that raises ``PurgeIncomplete`` is applied
    again at the next check (never sooner), until it goes through.
    """

    def __init__(
        self,
        disk_dir: str | None,
        namespace: str,
        interval: float,
        on_purge: Callable[[PurgeMarker, str], None],
        on_old_remote: Callable[[PurgeMarker], None] | None = None,
    ) -> None:
        self.disk_dir = disk_dir
        self.namespace = namespace
        self.interval = interval
        self._on_purge = on_purge
        # A remote record older than this watch: nothing cached in memory is
        # older, but directories of its own may be (they outlive a restart).
        self._on_old_remote = on_old_remote
        self._started = time.time()
        self._lock = threading.Lock()
        self._handled: OrderedDict[str, float] = OrderedDict()  # generation -> its newest time
        self._counted: OrderedDict[str, None] = OrderedDict()
        self._reported: OrderedDict[int, None] = OrderedDict()
        self._retrying: OrderedDict[str, str] = OrderedDict()  # left incomplete -> tier
        self._applying: set[str] = set()  # generations whose on_purge runs now
        self._applied = threading.Condition(self._lock)  # notified as each returns
        self._next_disk = 0.0
        self._disk_signature: tuple[int, int, int] | None = None
        self._disk_seen = False  # the disk log was looked at once
        self.remote_checked = False  # a first answer of the store came in
        self.bad_records = 0

    def poll_disk(self, now: float | None = None) -> bool:
        """Check the disk log if ``interval`` has passed; True if a purge was handled."""
        if self.disk_dir is None:
            return False
        now = time.monotonic() if now is None else now
        if now < self._next_disk:
            return False
        self._next_disk = now + self.interval
        signature = disk_signature(self.disk_dir, self.namespace)
        if signature is None or signature == self._disk_signature:
            self._disk_seen = True
            return False
        try:
            data = read_disk(self.disk_dir, self.namespace)
        except OSError as exc:
            # Signature not kept: a transient failure (EMFILE; ESTALE or EIO on
            # NFS) must not hide this log's purges. Read again at the next check.
            self._report(f"disk purge log {log_name(self.namespace)}: {exc}")
            return False
        self._disk_signature = signature
        first = not self._disk_seen
        self._disk_seen = True
        if data is None:
            return False
        handled, ahead = self._take_records(data, "disk", first)
        if ahead:  # read again at each check until this clock reaches the record
            self._disk_signature = None
        return handled

    def check_remote(self, catalog: Any) -> bool:
        """Read the remote log; True if a purge was handled. Store failures are
        logged at debug level and change nothing (the next check asks again)."""
        return self.read_remote(catalog) is True

    def read_remote(self, catalog: Any) -> bool | None:
        """Read the remote log and apply what is new in it: None if it could
        not be read, else whether a purge was handled."""
        try:
            data = read_remote(catalog, self.namespace)
        except Exception as exc:
            logger.debug("Reading the remote purge log failed: %s", exc)
            return None
        first = not self.remote_checked
        self.remote_checked = True
        return data is not None and self._handle(data, "remote", first)

    def _handle(self, data: bytes, tier: str, first: bool) -> bool:
        return self._take_records(data, tier, first)[0]

    def _take_records(self, data: bytes, tier: str, first: bool) -> tuple[bool, bool]:
        """Apply what is new in ``data``: (a purge handled, a record waits)."""
        now = time.time()
        handled = ahead = False
        for line in records(data):
            try:
                marker = PurgeMarker.parse(line, self.namespace, now)
            except RecordAhead as exc:
                ahead = True
                if self._report(f"a record of the {tier} purge log waits: {exc}", line):
                    self.bad_records += 1  # once: it is read again until taken
                continue
            except BadRecord as exc:
                self.bad_records += 1
                self._report(f"ignoring a bad record of the {tier} purge log: {exc}", line)
                continue
            handled |= self._seen(marker, tier, first)
        return handled, ahead

    def _seen(self, marker: PurgeMarker, tier: str, first: bool) -> bool:
        with self._lock:
            newest = self._handled.get(marker.generation)
            if newest is not None and marker.time <= newest:
                return False
            self._handled[marker.generation] = marker.time
            self._handled.move_to_end(marker.generation)
            if len(self._handled) > _REMEMBERED:
                self._handled.popitem(last=False)
            retry = self._retrying.get(marker.generation)
            self._applying.add(marker.generation)
        try:
            return self._apply(marker, tier, first, retry, again=newest is not None)
        finally:
            with self._applied:
                self._applying.discard(marker.generation)
                self._applied.notify_all()

    def wait_applied(self, timeout: float) -> bool:
        """Wait until no purge is being applied by another thread (one it took
        as new is handled only once its ``on_purge`` returned); False if one
        still was after ``timeout`` seconds. Never call it from a read."""
        with self._applied:
            return self._applied.wait_for(lambda: not self._applying, timeout)

    def counts(self, generation: str) -> bool:
        """True the first time it is asked of ``generation``: what counts one
        purge seen, however often its records were applied."""
        with self._lock:
            if generation in self._counted:
                return False
            self._counted[generation] = None
            if len(self._counted) > _REMEMBERED:
                self._counted.popitem(last=False)
            return True

    def _apply(
        self, marker: PurgeMarker, tier: str, first: bool, retry: str | None, *, again: bool
    ) -> bool:
        """Have ``on_purge`` apply a generation (or its later record) just taken
        as new, unless old news."""
        if retry == "remote":  # a remote record, seen again on disk, still does its part
            tier = "remote"
        if first and retry is None and marker.time < self._started:
            if tier == "remote" and self._on_old_remote is not None:
                self._on_old_remote(marker)
            return False  # there before we started: nothing in memory to drop
        if retry is None and not again:  # a retry is no news: logged when first seen
            logger.info(
                "Purge %s seen on the %s tier (selection %s); dropping cached copies",
                marker.generation[:8],
                tier,
                marker.describe(),
            )
        try:
            self._on_purge(marker, tier)
        except PurgeIncomplete as exc:
            self._retry_later(marker.generation, tier)
            self._report(
                f"purge {marker.generation[:8]} not fully applied (again at each check): {exc}"
            )
            return True
        except Exception as exc:  # never let a purge stop the watch
            self._report(f"applying purge {marker.generation[:8]} failed: {exc!r}")
        with self._lock:
            self._retrying.pop(marker.generation, None)
        return True

    def retrying(self) -> bool:
        """Whether a purge was left incomplete and waits to be applied again."""
        with self._lock:
            return bool(self._retrying)

    def _retry_later(self, generation: str, tier: str) -> None:
        """Forget ``generation`` so that the next check of ``tier`` applies it again."""
        with self._lock:
            self._handled.pop(generation, None)
            self._retrying[generation] = tier
            if len(self._retrying) > _REMEMBERED:
                self._retrying.popitem(last=False)
            if tier == "disk":
                self._disk_signature = None  # re-read the log though it did not change

    def _report(self, message: str, subject: bytes | None = None) -> bool:
        """Log ``message`` once per distinct problem (``subject``: the bytes at
        fault); True if it was news."""
        digest = xxhash.xxh3_64_intdigest(subject if subject is not None else message.encode())
        with self._lock:
            if digest in self._reported:
                return False
            self._reported[digest] = None
            if len(self._reported) > _REPORTED:
                self._reported.popitem(last=False)
        logger.warning("%s (logged once)", message)
        return True


__all__ = [
    "LOG_LIMIT",
    "RECORD_LIMIT",
    "BadRecord",
    "MarkerWatch",
    "PurgeIncomplete",
    "PurgeMarker",
    "RecordAhead",
    "UnreadableLog",
    "append_disk",
    "append_remote",
    "disk_path",
    "log_name",
    "log_name_of_slug",
    "read_disk",
    "read_remote",
    "records",
]
