"""Follows a Sentinel-managed primary between calls.

redis-py's Sentinel pool asks the sentinels for the primary only when it opens
a connection. After a planned failover (``SENTINEL FAILOVER``) the old primary
stays a writable primary for seconds, and the pooled connections keep writing
there; once it turns replica it drops those writes (measured: 21 of 30 entries
put in the 10 s after a failover were lost, with no failure anywhere). So a
thread asks the sentinels every ``interval``; when the primary moved, every
pooled connection is closed (calls under way fail once: a miss, their writes
remembered for re-sending) and the next call connects to the new primary.
Writes acknowledged by the old primary within the last interval may still be
lost there.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)
# The primary each service was last said to move to: a cache's stores (serving,
# purge log) each watch, and one line says it.
_said: dict[str, tuple[Any, ...]] = {}
_said_lock = threading.Lock()


class PrimaryWatch:
    def __init__(self, pool: Any, interval: float) -> None:
        self._pool = pool  # redis-py's SentinelConnectionPool
        self._interval = interval
        self._stop = threading.Event()
        self._primary: tuple[str, int] | None = None
        self._thread = threading.Thread(target=self._run, name="ec-sentinel-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.check()
        while not self._stop.wait(self._interval):
            self.check()

    def check(self) -> None:
        """Ask the sentinels once; close every connection if the primary moved."""
        try:
            primary = tuple(self._pool.sentinel_manager.discover_master(self._pool.service_name))
        except Exception as exc:  # sentinels unreachable: calls fail on their own
            logger.debug("Sentinel lookup failed: %s", exc)
            return
        if self._primary is not None and primary != self._primary:
            self._pool.disconnect()  # in use too: the old primary may drop what they write
            with _said_lock:
                new = _said.get(self._pool.service_name) != primary
                _said[self._pool.service_name] = primary
            if new:
                logger.warning(
                    "Redis Sentinel: the primary of %s is now %s:%s (was %s:%s); connections "
                    "to the old one closed (writes it took in the last %.1fs may be lost)",
                    self._pool.service_name,
                    *primary,
                    *self._primary,
                    self._interval,
                )
        self._primary = primary  # type: ignore[assignment]

    def close(self) -> None:
        self._stop.set()


__all__ = ["PrimaryWatch"]
