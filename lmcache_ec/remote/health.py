"""State about one remote store: is it answering, and which keys it holds.

``RemoteHealth``: the first failed or slow call marks the store unavailable;
one probe coroutine on the event loop then retries every ``retry_interval``
seconds (each attempt bounded by ``timeout``) until the store answers. While
unavailable, callers skip the store at once instead of waiting on it, so
nothing piles up however many requests arrive.

``RecentKeys``: keys seen stored remotely, so that a put of one sends nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import Future

from lmcache.utils import CacheEngineKey

from ..remote_names import redact_text

logger = logging.getLogger(__name__)

KNOWN_KEYS = 65536
KNOWN_TTL = 60.0


class RemoteHealth:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        describe: Callable[[], str],
        probe: Callable[[], Awaitable[None]],
        timeout: float,
        retry_interval: float,
        on_up: Callable[[], None] | None = None,
    ) -> None:
        self.loop = loop
        self._on_up = on_up
        self.counters: Counter[str] = Counter()
        self._describe = describe
        self._probe_once = probe
        self._timeout = timeout
        self._retry_interval = retry_interval
        self._up = threading.Event()
        self._up.set()
        self._lock = threading.Lock()
        self._probing = False
        self._probe: Future | None = None
        self._closed = False

    @property
    def up(self) -> bool:
        return self._up.is_set()

    def count(self, name: str, amount: int = 1) -> None:
        """Add to a counter; callers run on several threads."""
        with self._lock:
            self.counters[name] += amount

    def failed(self, operation: str, exc: object) -> None:
        """Record a failed call; the first one starts the probe."""
        with self._lock:
            self.counters["failures"] += 1
            was_up = self._up.is_set()
            self._up.clear()
            start_probe = not self._probing and not self._closed
            self._probing = self._probing or start_probe
        if was_up:
            logger.warning(
                "Remote tier %s unavailable (%s failed: %s); serving local tiers, "
                "probing every %.1fs",
                self._describe(),
                operation,
                exc or type(exc).__name__,
                self._retry_interval,
            )
        if start_probe:
            self._probe = asyncio.run_coroutine_threadsafe(self._probe_until_up(), self.loop)

    async def _probe_until_up(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._retry_interval)
            try:
                await asyncio.wait_for(self._probe_once(), self._timeout)
            except Exception as exc:
                logger.debug("Remote probe failed: %s", redact_text(str(exc)))
                continue
            # Cleared and set under one lock: a failure right after is never lost.
            with self._lock:
                self._probing = False
                self._up.set()
                self.counters["reconnects"] += 1
            logger.warning("Remote tier %s available again", self._describe())
            if self._on_up is not None:
                try:
                    self._on_up()
                except Exception as exc:
                    logger.warning("Remote recovery hook failed: %s", exc)
            return
        with self._lock:
            self._probing = False

    def close(self) -> None:
        self._closed = True
        self._up.clear()
        if self._probe is not None:
            self._probe.cancel()


class RecentKeys:
    """Keys recently seen stored remotely: bounded, and forgotten after ``ttl``
    seconds so that an entry evicted or purged elsewhere is uploaded again."""

    def __init__(self, limit: int = KNOWN_KEYS, ttl: float = KNOWN_TTL) -> None:
        self._keys: OrderedDict[CacheEngineKey, float] = OrderedDict()
        self._limit = limit
        self._ttl = ttl
        self._lock = threading.Lock()

    def add(self, key: CacheEngineKey) -> None:
        with self._lock:
            self._keys[key] = time.monotonic() + self._ttl
            self._keys.move_to_end(key)
            while len(self._keys) > self._limit:
                self._keys.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()

    def discard(self, key: CacheEngineKey) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            expires = self._keys.get(key)  # type: ignore[call-overload]
            if expires is None:
                return False
            if expires < time.monotonic():
                del self._keys[key]  # type: ignore[arg-type]
                return False
            return True
