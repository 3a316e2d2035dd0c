"""Scheduler-side bookkeeping of prefetches: arrival order, bounds, waiters.

A prefetch is an order for the workers to fetch an item from the tiers into
worker memory while its requests are deferred. Orders leave the queue in
arrival order, and only while the in-flight bounds allow: at most
``max_items`` items and ``max_bytes`` estimated bytes ordered but not yet
consumed by a load (or released). The head of the queue waits for room
rather than letting smaller items overtake it, so a large image is not
starved; an item larger than ``max_bytes`` is never queued (it is computed).

Items are shared: requests that need the same image wait on one prefetch.

One request never waits on more than the bounds allow (``Room``): its
staged items hold their room until the request is scheduled with all of
them, so the ones beyond the bounds would wait for room only the request
itself can free. Those are computed at once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Queued:
    deadline: float
    nbytes: int


@dataclass
class Room:
    """What one request may still wait on: items and estimated bytes."""

    items: int
    nbytes: int

    def fits(self, nbytes: int) -> bool:
        return self.items >= 1 and nbytes <= self.nbytes

    def take(self, nbytes: int) -> None:
        self.items -= 1
        self.nbytes -= nbytes


class PrefetchQueue:
    def __init__(self, *, max_items: int, max_bytes: int) -> None:
        self.max_items = max(1, max_items)
        self.max_bytes = max_bytes
        self._queued: OrderedDict[str, _Queued] = OrderedDict()
        self._inflight: dict[str, int] = {}  # identifier -> estimated bytes
        self._inflight_bytes = 0
        self._waiters: dict[str, set[str]] = {}  # identifier -> request ids
        self._waited_on: dict[str, set[str]] = {}  # request id -> identifiers
        # Queued or in flight -> the rows (placeholders) of the request that queued it.
        self._rows: dict[str, int] = {}

    # -- waiters -------------------------------------------------------------

    def wait(self, identifier: str, request_id: str) -> None:
        self._waiters.setdefault(identifier, set()).add(request_id)
        self._waited_on.setdefault(request_id, set()).add(identifier)

    def take_waiters(self, identifier: str) -> set[str]:
        waiters = self._waiters.pop(identifier, set())
        for request_id in waiters:
            waited_on = self._waited_on.get(request_id)
            if waited_on is not None:
                waited_on.discard(identifier)
                if not waited_on:
                    del self._waited_on[request_id]
        return waiters

    def waited_on(self, identifier: str) -> bool:
        """Whether a request still waits for ``identifier``."""
        return identifier in self._waiters

    def forget_request(self, request_id: str) -> list[str]:
        """Drop ``request_id``'s waits; the items no request waits for any more."""
        unwaited = []
        for identifier in self._waited_on.pop(request_id, ()):
            waiters = self._waiters.get(identifier)
            if waiters is not None:
                waiters.discard(request_id)
                if not waiters:
                    del self._waiters[identifier]
                    unwaited.append(identifier)
        return unwaited

    # -- queue and bounds ----------------------------------------------------

    def fits_at_all(self, nbytes: int) -> bool:
        return nbytes <= self.max_bytes

    def room(self, waited_bytes: list[int]) -> Room:
        """A request's room, given the estimated bytes of what it waits on already."""
        return Room(self.max_items - len(waited_bytes), self.max_bytes - sum(waited_bytes))

    def enqueue(self, identifier: str, deadline: float, nbytes: int, rows: int = 0) -> None:
        self._queued[identifier] = _Queued(deadline, nbytes)
        self._rows[identifier] = rows

    def rows(self, identifier: str) -> int | None:
        """The rows ``identifier`` was queued for (0: not said); None if not
        queued or in flight. A staged copy of other rows is refused."""
        return self._rows.get(identifier)

    def queued(self) -> list[str]:
        """Identifiers waiting for room, in arrival order."""
        return list(self._queued)

    def dispatch(self) -> list[tuple[str, float]]:
        """Move queue heads in flight while the bounds allow, in arrival order.

        Returns ``(identifier, deadline)`` of each started prefetch; the
        deadline set at queueing still holds, so waiting for room counts.
        """
        started = []
        while self._queued:
            identifier, queued = next(iter(self._queued.items()))
            full = len(self._inflight) >= self.max_items
            if full or self._inflight_bytes + queued.nbytes > self.max_bytes:
                break
            del self._queued[identifier]
            self._inflight[identifier] = queued.nbytes
            self._inflight_bytes += queued.nbytes
            started.append((identifier, queued.deadline))
        return started

    def done(self, identifier: str) -> None:
        """The item left flight (loaded, released, failed) or the queue."""
        self._queued.pop(identifier, None)
        self._rows.pop(identifier, None)
        self._inflight_bytes -= self._inflight.pop(identifier, 0)

    @property
    def inflight_items(self) -> int:
        return len(self._inflight)
