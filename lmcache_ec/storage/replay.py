"""Uploading, after a remote outage, what was written locally during it.

While the remote tier is down, puts reach only the local tiers and the remote
backend remembers their keys (``ECRemoteBackend.remember_missed``). When its
health probe sees the store again, it calls back here; a background thread
re-reads each key from the CPU or disk tier, verifies the frame (a damaged
local copy must not spread to every instance) and hands it to the remote
backend's asynchronous upload. Keys no longer held locally are skipped; if
the store fails again mid-way, the rest are remembered for the next recovery.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from lmcache.v1.memory_management import MemoryObj

from .. import codec
from ..key import ECKey
from ..tier_contract import Tier, TierKind
from .manager import ECStorageManager

logger = logging.getLogger(__name__)


class RemoteReplayer:
    def __init__(
        self,
        storage: ECStorageManager,
        frame_bytes: Callable[[MemoryObj], Any],
        is_closed: Callable[[], bool],
    ) -> None:
        self._storage = storage
        self._frame_bytes = frame_bytes
        self._is_closed = is_closed
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
            keys = remote.take_missed()
            for done, key in enumerate(keys):
                if self._is_closed() or not remote.available:
                    remote.remember_missed(keys[done:])
                    return
                self._replay(key, remote)
            if keys:
                logger.info(
                    "Remote tier %s: %d entries written during the outage re-sent",
                    remote.name,
                    len(keys),
                )
        except Exception as exc:  # never let a replay failure escape the thread
            logger.warning("Re-sending entries to %s failed: %s", remote.name, exc)
        finally:
            with self._lock:
                self._running.discard(remote.name)

    def _replay(self, key: ECKey, remote: Tier) -> None:
        cpu = self._storage.cpu
        for tier in self._storage.every_tier():
            if not tier.kind.local:
                continue
            memory_obj = tier.read_into_pool(key, cpu.allocate_frame)
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
            return
