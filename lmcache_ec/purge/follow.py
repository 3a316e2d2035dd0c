"""Purges made by other processes, applied to one engine's own state.

``lmcache-ec purge`` in another process deletes entries from the shared tiers
and appends a record to its namespace's purge log (``purge/marker.py``). An
engine follows its own namespace's logs on the tiers it shares: the disk log
is ``stat``-ed by reads and writes (at most every ``purge_check_s``, through
``watch.poll_disk``); the remote one is read by the ``ec-purge-watch`` thread
at the same interval (never by a read), which also checks the disk log for an
engine that is idle. The thread outlives any failure: an error is logged once
and the next check runs as usual. A purge that left one of this engine's
entries on disk (an I/O error deleting it) is not counted, and is applied
again at each check until every entry it selected is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..config import ECConfig
from ..key import ECKey
from ..metrics import ECStats
from . import selection
from .marker import MarkerWatch, PurgeIncomplete, PurgeMarker

if TYPE_CHECKING:
    from ..storage.manager import ECStorageManager
    from ..storage.reads import TierReader

logger = logging.getLogger(__name__)

# How long ``read_remote_now`` waits, beyond ``close_timeout`` (the wait for
# writes in flight), for the watch thread to finish applying a purge it took
# first: the time to scan the engine's own directories.
APPLY_WAIT_S = 30.0


class PurgeFollower:
    def __init__(
        self,
        config: ECConfig,
        namespace: str,
        storage: ECStorageManager,
        reader: TierReader,
        stats: ECStats,
    ) -> None:
        self._config = config
        self._namespace = namespace
        self._storage = storage
        self._reader = reader
        self._stats = stats
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._last_failure = ""
        # Purges whose part on this engine's own directories the watch thread
        # does (again), by generation: a disk record's (an entry a read in
        # flight wrote back after the purger deleted it), or a remote record
        # older than this engine (its private directories outlived a restart).
        self._rescans: dict[str, PurgeMarker] = {}
        interval = config.purge_check_s
        disk_dir = storage.disk.directory if storage.disk is not None else None
        self.watch = MarkerWatch(
            disk_dir, namespace, interval, self._purged, on_old_remote=self._rescan_later
        )
        self._thread: threading.Thread | None = None
        if disk_dir is None and config.remote.url is None:
            return
        self._thread = threading.Thread(target=self._loop, name="ec-purge-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the watch thread to end (``join`` waits for it)."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        catalog = None
        try:
            while True:
                try:
                    if catalog is None and self._config.remote.url is not None:
                        catalog = selection.open_remote(self._config)  # retried until it opens
                    if catalog is not None:
                        self.watch.check_remote(catalog)
                    self.watch.poll_disk()
                    self._run_rescans()
                except Exception as exc:  # the watch outlives anything one check does
                    self._failed(exc)
                self._wake.wait(self.watch.interval)
                self._wake.clear()
                if self._stop.is_set():
                    return
        finally:
            if catalog is not None:
                catalog.close()

    def read_remote_now(self) -> bool:
        """Read the remote purge log now, in this thread, and apply what is new
        in it (before writes made during an outage are re-sent: a purge recorded
        meanwhile must not be undone); False if it could not be read, or if a
        purge in it is not applied yet. A purge the watch thread took first is
        waited for (at most ``close_timeout`` + ``APPLY_WAIT_S``: the caller is
        the replay's background thread, never a read)."""
        if self._config.remote.url is None:
            return True
        try:
            catalog = selection.open_remote(self._config)
        except Exception as exc:
            logger.debug("Opening the remote purge log failed: %s", exc)
            return False
        if catalog is None:
            return True
        try:
            if self.watch.read_remote(catalog) is None:
                return False
            if not self.watch.wait_applied(self._config.close_timeout + APPLY_WAIT_S):
                logger.warning("Purge watch: a purge is still being applied (too long to wait)")
                return False
            # A purge left incomplete may have left entries it selects on disk.
            return not self.watch.retrying()
        finally:
            catalog.close()

    def _failed(self, exc: Exception) -> None:
        message = f"{type(exc).__name__}: {exc}"
        if message != self._last_failure:  # once per distinct failure
            self._last_failure = message
            logger.warning("Purge watch: a check failed (it keeps running): %s", message)

    def _purged(self, marker: PurgeMarker, tier: str) -> None:
        """Another process purged ``marker``'s selection from ``tier``; the
        selection is this engine's namespace's (the log's), whatever the record says.

        - remote record (on the watch thread): entries of this engine's own
          disk and node directories that the purge selected and that were
          created before it are deleted first — the purging process may not
          share them; a disk record: the watch thread looks at them again soon
          (``_rescan_later``), never the caller of a read that noticed it;
        - the CPU tier drops every entry whose namespace and model (and, when
          known from the key, weights version) the purge selected, whatever its
          age: they are read again from a lower tier if still there;
        - the remote tier forgets which keys it saw stored (a later put uploads
          again).

        Reads begun before either part are served but not promoted
        (``TierReader.purge_begins``): what they hold may be purged.
        ``PurgeIncomplete`` (after all of the above) if an entry could not be
        deleted: the watch applies the purge again at its next check.
        """
        selector = marker.selector(self._namespace)
        if tier == "remote":
            undone = self._purge_own_directories(selector)
        else:
            undone = []
            self._rescan_later(marker)
        self._reader.purge_begins()
        try:
            with self._lock:
                self._drop_cpu(selector)
                for each in self._storage.every_tier():
                    each.forget_stored()
        finally:
            self._reader.purge_ends()
        if undone:  # still served from disk: not applied yet
            raise PurgeIncomplete(
                f"{len(undone)} selected entries not deleted (first: {undone[0]})"
            )
        if self.watch.counts(marker.generation):  # once nothing serves the selection
            self._stats.add("purges_seen")

    def _rescan_later(self, marker: PurgeMarker) -> None:
        """Have the watch thread apply ``marker`` to this engine's own directories."""
        with self._lock:
            self._rescans[marker.generation] = marker
        self._wake.set()

    def _run_rescans(self) -> None:
        """(watch thread) The queued directory parts; one left undone stays queued."""
        with self._lock:
            queued = list(self._rescans.values())
        for marker in queued:
            undone = self._purge_own_directories(marker.selector(self._namespace))
            if undone:
                self._failed(PurgeIncomplete(f"purge {marker.generation[:8]}: {undone[0]}"))
                continue
            with self._lock:
                self._rescans.pop(marker.generation, None)

    def _purge_own_directories(self, selector: selection.Selector) -> list[str]:
        """(watch thread) Delete what ``selector`` selects in this engine's disk
        and node directories, then from the CPU tier what promotions put there
        meanwhile; what was left undone."""
        local = [t for t in self._storage.every_tier() if t.directory is not None]
        self._reader.purge_begins()
        try:
            # Writes accepted before now may be entries the purge selects: they
            # land first (promotions accepted from now on are skipped).
            if not self._writes_landed(local):
                return [f"writes to {local[0].directory} still pending"]
            undone: list[str] = []
            for each in local:
                undone += self._purge_directory(each.directory, selector)
            with self._lock:
                self._drop_cpu(selector)
            return undone
        finally:
            self._reader.purge_ends()

    def _writes_landed(self, tiers: list) -> bool:
        """Whether the writes in flight to ``tiers`` now landed within ``close_timeout``."""
        waited = [(each, each.writes_in_flight()) for each in tiers]
        deadline = time.monotonic() + self._config.close_timeout
        while any(keys & each.writes_in_flight() for each, keys in waited):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def _purge_directory(self, directory: str, selector: selection.Selector) -> list[str]:
        """Delete the entries of ``directory`` that ``selector`` selects, each
        on its own (one that fails stops no other); what was left undone."""
        try:
            entries = selection.scan_disk(directory, selector)
        except OSError as exc:
            return [f"{directory} unlisted: {exc}"]
        for entry in entries:
            selection.read_disk_header(entry)  # an unreadable header: its file's mtime
        undone = []
        for entry in selection.filter_headers(entries, selector):
            try:
                selection.delete_disk(entry)
            except OSError as exc:
                undone.append(f"{entry.path}: {exc.strerror or exc}")
        return undone

    def _drop_cpu(self, selector: selection.Selector) -> None:
        cpu = self._storage.cpu
        dropped = 0
        for key, _ in cpu.entries():
            if not selector.matches_name(key.to_string()):
                continue
            identity = key.identity if isinstance(key, ECKey) else None
            known = selector.weights is not None and identity is not None
            if known and identity.weights != selector.weights:
                continue
            if isinstance(key, ECKey):
                self._reader.cancel(key)
            if cpu.remove(key):
                dropped += 1
        if dropped:
            logger.info("Purge: %d entries dropped from the CPU tier", dropped)
