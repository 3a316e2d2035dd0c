"""The scheduler's view of what the tiers hold, answered without network I/O.

``lookup`` is called on the scheduler's hot path. It consults, in order:

1. what workers reported saving or staging (``note_present``), in memory;
2. the disk tier: a listing of ``<local_disk>`` (``DiskListing``) kept by a
   background thread, which looks at the directory's modification time every
   10 ms and lists it again when it changed. While the listing is current,
   ``lookup`` makes no file-system call. Once the thread has seen a change it
   has not listed yet (another process writing; and for a second after the
   last change, as directory times are coarse), each lookup ``stat``-s the
   entry itself: an entry written elsewhere is found within ~10 ms.
   ``fresh=True`` always ``stat``-s. Positive answers are remembered;
3. the remote tier: answered from a cache filled by a background thread
   (``RemoteCatalog.lookup``). An item not yet checked is queued and reported
   ``PENDING``; the caller decides how long to wait. A check left unanswered
   is asked once more at once; while the store still fails to answer (then
   for 5 s), or when too many lookups are queued, items are reported absent
   at once (the encoder runs) instead of queuing behind a dead server.

A purge of this identity's namespace by another process (``lmcache-ec
purge``, see ``purge/marker.py``) clears every remembered answer: the disk
purge log is ``stat``-ed by ``lookup`` at most every ``purge_check_s``, the
remote one read by the background thread at the same interval. A bad log or
record is logged once and never reaches ``lookup``'s caller.

No ECCache is built and no CPU pool is allocated in the scheduler process.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ...config_schema import SCHEMA
from ...key import EncoderIdentity
from ...purge.marker import MarkerWatch, PurgeMarker
from ...tiers.disk_layout import DirectoryLayout

logger = logging.getLogger(__name__)

PENDING = "pending"
_MAX_ENTRIES = 1_000_000  # identifiers remembered (LRU); ~300 bytes each, identifier included
_MAX_PENDING = 4096  # queued remote lookups; beyond it, answer "absent"
_REMOTE_BACKOFF = 5.0  # seconds without remote lookups after the store failed to answer
_LOOKUP_BATCH = 256  # existence checks per round trip
_MAX_NAMES = 65_536  # storage names remembered (computing one costs a few µs)
_DISK_CHECK_S = 0.01  # how often the background thread looks at the directory's time
_RACY_S = 1.0  # a listing taken this soon after the directory changed may miss an entry
_MIN_RESCAN_S = 0.05  # listings at most this often (or 10x a listing's own time)


class DiskListing:
    """The entry names of a disk directory, listed by a background thread.

    ``current()`` says whether the listing can answer alone: the directory's
    modification time, looked at every ``check_s`` by the thread, is the one
    it was listed at, and that time was at least ``_RACY_S`` before the
    listing (coarse timestamps: an entry added in the same tick would not
    change it). Otherwise callers check entries themselves until the thread
    has listed the directory again. The thread holds only a weak reference:
    a listing nobody closes stops with its owner.
    """

    def __init__(self, directory: str, check_s: float = _DISK_CHECK_S) -> None:
        self.directory = directory
        self.layout = DirectoryLayout(directory)
        self.check_s = check_s
        self.names: frozenset[str] = frozenset()
        self._listed_at: int | None = None  # directory mtime (ns) the names are of
        self._seen: int | None = None  # directory mtime (ns) at the thread's last look
        self._next_scan = 0.0
        self._stop = threading.Event()
        self._scan()
        self._thread = threading.Thread(
            target=_watch,
            args=(weakref.ref(self), self._stop, check_s),
            name="ec-index-disk",
            daemon=True,
        )
        self._thread.start()

    def current(self) -> bool:
        return self._listed_at is not None and self._seen == self._listed_at

    def _look(self) -> None:
        """One look at the directory (thread): list it again if it changed."""
        self._seen = _mtime_ns(self.directory)
        if self._seen != self._listed_at and time.perf_counter() >= self._next_scan:
            self._scan()

    def _scan(self) -> None:
        started = time.perf_counter()
        before = _mtime_ns(self.directory)
        names: set[str] | None = set()
        complete = True
        try:
            # None: too large to hold, entries are checked one by one. A missing
            # directory lists empty: creating it changes its time from -1.
            names = self.layout.names(_MAX_ENTRIES)
            complete = names is not None
        except OSError as exc:
            logger.debug("Listing %s failed: %s", self.directory, exc)
            complete = False
        racy = before is None or time.time_ns() - before < _RACY_S * 1e9
        self.names = frozenset(names or ())
        self._listed_at = before if complete and not racy else None
        self._seen = before
        spent = time.perf_counter() - started
        self._next_scan = time.perf_counter() + max(_MIN_RESCAN_S, 10 * spent)

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)


def _watch(listing_ref: weakref.ref[DiskListing], stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        listing = listing_ref()
        if listing is None:
            return
        listing._look()
        del listing


def _mtime_ns(directory: str) -> int | None:
    """The directory's modification time; -1 if it does not exist (no entries), None
    if it cannot be read."""
    try:
        return os.stat(directory).st_mtime_ns
    except FileNotFoundError:
        return -1
    except OSError:
        return None


class _LRU(OrderedDict):
    def remember(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > _MAX_ENTRIES:
            self.popitem(last=False)


def _ask_twice(catalog: Any, names: list[str], closing: threading.Event) -> list[bool | None]:
    """``catalog.lookup_many``, asking once more for the names left unanswered: a
    dropped connection or one late reply costs a round trip, not the backoff's
    seconds of encodes. Not asked again once the index is closing."""
    answers = catalog.lookup_many(names)
    unanswered = [i for i, present in enumerate(answers) if present is None]
    if unanswered and not closing.is_set():
        again = catalog.lookup_many([names[i] for i in unanswered])
        for i, present in zip(unanswered, again, strict=True):
            answers[i] = present
    return answers


def _why_unanswered(catalog: Any) -> str:
    if catalog is None:
        return "no catalog"
    return catalog.last_error or "no answer"


class TierIndex:
    """Where an identifier can be loaded from: ``worker``/``disk``/``remote``/None/PENDING."""

    def __init__(
        self,
        identity: EncoderIdentity,
        *,
        disk_dir: str | None,
        open_catalog: Callable[[], Any] | None,
        negative_ttl: float,
        positive_ttl: float = 60.0,
        purge_check_s: float | None = None,
    ) -> None:
        self.identity = identity
        self.disk_dir = disk_dir
        self.negative_ttl = negative_ttl
        # Entries can be purged or evicted elsewhere: after this long a disk answer
        # is re-checked (a stat), a remote one re-asked in the background.
        self.positive_ttl = positive_ttl
        self.remote_lookups = 0  # answered by the background thread
        self.remote_failures = 0  # lookups the store could not answer
        self._remote_down_until = 0.0
        self._known: _LRU = _LRU()  # identifier -> (tier, noted_at)
        self._remote: _LRU = _LRU()  # identifier -> (present, answered_at)
        self._pending: set[str] = set()
        self._answered_ids: set[str] = set()  # remote checks answered since take_answered
        self._names: _LRU = _LRU()  # identifier -> storage name
        self._disk = DiskListing(disk_dir) if disk_dir is not None else None
        self._generation = 0  # bumped by set_identity: older remote answers are dropped
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)  # a remote batch came back
        self.purges_seen = 0
        if purge_check_s is None:
            purge_check_s = float(SCHEMA["purge_check_s"].default)
        self._purges = MarkerWatch(disk_dir, identity.namespace, purge_check_s, self._purged)
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        # Set by close: a check still in flight then ends quietly (no retry, no warning).
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        if open_catalog is not None:
            self._thread = threading.Thread(
                target=self._remote_loop, args=(open_catalog,), name="ec-index-remote", daemon=True
            )
            self._thread.start()

    def storage_name(self, identifier: str) -> str:
        name = self._names.get(identifier)
        if name is None:
            name = self.identity.storage_name(identifier)
            self._names[identifier] = name
            if len(self._names) > _MAX_NAMES:
                self._names.popitem(last=False)
        return name

    def set_identity(self, identity: EncoderIdentity) -> None:
        """Answer for ``identity`` from now on (new encoder weights): forget the rest."""
        with self._lock:
            self.identity = identity
            self._purges.namespace = identity.namespace
            self._generation += 1
            self._known.clear()
            self._remote.clear()
            self._names.clear()

    def _purged(self, marker: PurgeMarker, tier: str) -> None:
        """Entries were purged elsewhere: forget every remembered answer."""
        with self._lock:
            self.purges_seen += self._purges.counts(marker.generation)
            self._generation += 1  # answers in flight are dropped too
            self._known.clear()
            self._remote.clear()

    def lookup(self, identifier: str, *, fresh: bool = False) -> str | None:
        """``worker``/``disk``/``remote``/None, or PENDING while the remote is asked.

        ``fresh``: for an item another instance is about to store, check the
        disk entry itself and ask the remote again rather than trust a
        remembered "absent".
        """
        now = time.monotonic()
        self._purges.poll_disk(now)
        with self._lock:
            known = self._known.get(identifier)
            if known is not None:
                tier, noted_at = known
                # Worker reports stay until a staging of the item fails (forget).
                if tier != "disk" or now - noted_at < self.positive_ttl:
                    return tier
                del self._known[identifier]
        if self._disk is not None:
            name = self.storage_name(identifier)
            if fresh or not self._disk.current():
                path = self._disk.layout.path_of(name)
                on_disk = os.path.exists(path)
            else:
                on_disk = name in self._disk.names
            if on_disk:
                self.note_present(identifier, "disk")
                return "disk"
        if self._thread is None:
            return None
        with self._lock:
            answer = self._remote.get(identifier)
            if answer is not None:
                present, answered_at = answer
                if present:
                    # Stale-while-revalidate: never defer an item believed present.
                    stale = now - answered_at >= self.positive_ttl
                    if stale and identifier not in self._pending:
                        self._pending.add(identifier)
                        self._queue.put(identifier)
                    return "remote"
                if now - answered_at < self.negative_ttl and not fresh:
                    return None
            if identifier in self._pending:
                return PENDING
            if time.monotonic() < self._remote_down_until or len(self._pending) >= _MAX_PENDING:
                return None
            self._pending.add(identifier)
        self._queue.put(identifier)
        return PENDING

    def take_answered(self) -> set[str]:
        """Identifiers whose remote check ended since the last call (answered or not)."""
        with self._lock:
            answered, self._answered_ids = self._answered_ids, set()
        return answered

    def wait_answer(self, identifier: str, timeout: float) -> None:
        """Wait up to ``timeout`` s for a pending remote lookup of ``identifier``."""
        with self._answered:
            self._answered.wait_for(lambda: identifier not in self._pending, timeout)

    def note_present(self, identifier: str, tier: str) -> None:
        with self._lock:
            self._known.remember(identifier, (tier, time.monotonic()))

    def forget(self, identifier: str) -> None:
        """Drop what is known about ``identifier`` (a load of it failed)."""
        with self._lock:
            self._known.pop(identifier, None)
            self._remote.pop(identifier, None)

    def _remote_loop(self, open_catalog: Callable[[], Any]) -> None:
        try:
            catalog = open_catalog()
        except Exception as exc:
            logger.warning("Remote catalog unavailable; remote tier not indexed: %s", exc)
            catalog = None
        next_marker_check = 0.0
        try:
            while (batch := self._next_batch(self._purges.interval)) is not None:
                now = time.monotonic()
                if catalog is not None and now >= next_marker_check:
                    next_marker_check = now + self._purges.interval
                    if now >= self._remote_down_until:
                        self._purges.check_remote(catalog)
                if not batch:
                    continue
                answers: list[bool | None] = [None] * len(batch)
                failed = True  # the store did not answer at all
                with self._lock:
                    identity, generation = self.identity, self._generation
                if catalog is not None and time.monotonic() >= self._remote_down_until:
                    try:  # one round trip for everything asked meanwhile
                        names = [identity.storage_name(identifier) for identifier in batch]
                        answers = _ask_twice(catalog, names, self._closing)
                        failed = bool(catalog.last_error)
                    except Exception as exc:  # the catalog should not raise; be sure
                        logger.debug("Remote existence check failed: %s", exc)
                if self._closing.is_set():
                    break
                with self._lock:
                    self._answered.notify_all()
                    self._answered_ids.update(batch)
                    if generation != self._generation:  # asked for other weights: ask again
                        self._pending.difference_update(batch)
                        continue
                    for identifier, present in zip(batch, answers, strict=True):
                        self._pending.discard(identifier)
                        if present is not None:
                            self._remote.remember(identifier, (present, time.monotonic()))
                            self.remote_lookups += 1
                        elif not failed:  # its shard is down, the others answer: a miss
                            self._remote.remember(identifier, (False, time.monotonic()))
                    if failed:
                        # Unanswered: not cached, so asked again after the backoff.
                        if time.monotonic() >= self._remote_down_until:
                            logger.warning(
                                "Remote tier not answering (%s); lookups paused for %.0fs",
                                _why_unanswered(catalog),
                                _REMOTE_BACKOFF,
                            )
                        self._remote_down_until = time.monotonic() + _REMOTE_BACKOFF
                        self.remote_failures += 1
        finally:
            if catalog is not None:
                try:
                    catalog.close()
                except Exception as exc:
                    logger.debug("Closing the remote catalog: %s", exc)

    def _next_batch(self, timeout: float) -> list[str] | None:
        """Wait up to ``timeout`` for one identifier, then take whatever else is
        queued; [] if none came; None: stop."""
        try:
            first = self._queue.get(timeout=timeout)
        except queue.Empty:
            return []
        if first is None:
            return None
        batch = [first]
        while len(batch) < _LOOKUP_BATCH:
            try:
                identifier = self._queue.get_nowait()
            except queue.Empty:
                break
            if identifier is None:
                self._queue.put(None)  # stop after this batch
                break
            batch.append(identifier)
        return batch

    def close(self, timeout: float = 2.0) -> None:
        """Stop the listing and lookup threads, within ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        if self._thread is not None:  # told first: both stop side by side
            self._closing.set()
            self._queue.put(None)
        if self._disk is not None:
            self._disk.close(max(deadline - time.monotonic(), 0.0))
        if self._thread is not None:
            self._thread.join(max(deadline - time.monotonic(), 0.0))
            self._thread = None
