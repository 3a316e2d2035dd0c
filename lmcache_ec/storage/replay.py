"""Uploading, after a remote outage, what was written locally during it.

While the remote tier is down, puts reach only the local tiers and the remote
backend remembers their keys (``ECRemoteBackend.remember_missed``). When its
health probe sees the store again, it calls back here; a background thread
re-reads each key from the CPU or disk tier, verifies the frame (a damaged
local copy must not spread to every instance) and hands it to the remote
backend's asynchronous upload. Keys no longer held locally are skipped; if
the store fails again mid-way, the rest are remembered for the next recovery.

- The remote purge log is read (and what is new in it applied) first: a
  purge recorded during the outage must not be undone by a re-send of an
  entry it selected. If the log cannot be read, nothing is re-sent now (the
  keys wait for the next recovery).
- At most ``AHEAD`` uploads are queued at a time: each holds a CPU-pool
  buffer, and a replay running ahead of its uploads would find the pool
  full and skip entries it still holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from lmcache.v1.memory_management import MemoryObj

from .. import codec
from ..key import ECKey
from ..tier_contract import Tier, TierKind
from .manager import ECStorageManager

logger = logging.getLogger(__name__)

AHEAD = 8  # uploads a replay keeps queued at most
_POLL_S = 0.005


class RemoteReplayer:
    def __init__(
        self,
        storage: ECStorageManager,
        frame_bytes: Callable[[MemoryObj], Any],
        is_closed: Callable[[], bool],
        read_purges: Callable[[], bool],
    ) -> None:
        self._storage = storage
        self._frame_bytes = frame_bytes
        self._is_closed = is_closed
        self._read_purges = read_purges  # False: the remote purge log could not be read
        self._running: set[str] = set()
        self._lock = threading.Lock()

    def attach(self) -> None:
        """Be called back by every tier that comes back up (the remote ones)."""
        for tier in self._storage.every_tier():
            tier.on_recovered = lambda t=tier: self.start(t)

    def start(self, remote: Tier) -> None:
        with self._lock:
            if remote.name in self._running or self._is_closed():
                return
            self._running.add(remote.name)
        threading.Thread(
            target=self._run, args=(remote,), name="ec-remote-replay", daemon=True
        ).start()

    def _run(self, remote: Tier) -> None:
        try:
            if not self._read_purges():
                logger.warning(
                    "Remote tier %s: its purge log could not be read; entries written "
                    "during the outage are re-sent after the next recovery",
                    remote.name,
                )
                return
            keys = remote.take_missed()
            resent = remote.counters["resent"]
            for done, key in enumerate(keys):
                if not self._room_to_send(remote) or not self._replay(key, remote):
                    remote.remember_missed(keys[done:])
                    return
            resent = remote.counters["resent"] - resent
            if resent:
                logger.info(
                    "Remote tier %s: %d entries written during the outage re-sent",
                    remote.name,
                    resent,
                )
            if len(keys) > resent:  # no local tier holds them any more (or damaged)
                logger.warning(
                    "Remote tier %s: %d entries written during the outage are held by no "
                    "local tier now (evicted, or no local tier): they never reach it",
                    remote.name,
                    len(keys) - resent,
                )
        except Exception as exc:  # never let a replay failure escape the thread
            logger.warning("Re-sending entries to %s failed: %s", remote.name, exc)
        finally:
            with self._lock:
                self._running.discard(remote.name)

    def _room_to_send(self, remote: Tier) -> bool:
        """Wait until fewer than ``AHEAD`` uploads are queued; False once the
        cache closed or the tier went down again."""
        while remote.pending_writes() >= AHEAD:
            if self._is_closed() or not remote.available:
                return False
            time.sleep(_POLL_S)
        return not self._is_closed() and remote.available

    def _replay(self, key: ECKey, remote: Tier) -> bool:
        """Re-send ``key`` if a local tier holds it; False if one holds it but the
        CPU pool has no room for it even once the queued uploads are sent."""
        for tier in self._storage.every_tier():
            if not tier.kind.local:
                continue
            memory_obj, no_room = self._read(tier, key)
            if no_room:  # held, but no pool room: again once the queued uploads are sent
                if not self._drained(remote):
                    return False
                memory_obj, no_room = self._read(tier, key)
                if no_room:
                    return False
            if memory_obj is None:
                continue
            try:
                buffer = self._frame_bytes(memory_obj)
                if buffer is None:
                    continue
                # CPU frames never left this process; disk frames are re-checked.
                codec.decode_payload(buffer, key, verify_payload=tier.kind is not TierKind.CPU)
                remote.write(key, memory_obj)
                remote.counters["resent"] += 1
            except codec.CorruptEntryError as exc:
                logger.warning("Not re-sending corrupt local entry %s: %s", key, exc.reason)
            finally:
                memory_obj.ref_count_down()
            return True
        return True

    def _read(self, tier: Tier, key: ECKey) -> tuple[MemoryObj | None, bool]:
        """``key``'s frame from ``tier`` in a pool buffer, and whether the pool
        had no room for it (then None, though the tier holds it)."""
        refused: list[int] = []

        def allocate(size: int) -> MemoryObj | None:
            memory_obj = self._storage.cpu.allocate_frame(size)
            if memory_obj is None:
                refused.append(size)
            return memory_obj

        memory_obj = tier.read_into_pool(key, allocate)
        return memory_obj, memory_obj is None and bool(refused)

    def _drained(self, remote: Tier) -> bool:
        while remote.pending_writes():
            if self._is_closed() or not remote.available:
                return False
            time.sleep(_POLL_S)
        return True
