"""Single flight: one computation of an entry, in a process and across instances.

Two layers, both used by ``ECCache.get_or_compute`` (``get_or_compute.py``) and
the second also by the vLLM connector (``integration/vllm/encode_claims.py``):

- In a process (``LocalFlights``): callers asking for the same entry at once
  share one computation; the first is its *leader*, the others *followers*
  receive a copy of its result.
- Across instances sharing a tier: the claims of ``claims.py``, made by a
  ``ClaimAgent`` in a store the instances share (``claim_store_factory``), and
  one rule for what a caller does next (``ClaimWait.turn``): compute, keep
  waiting for another holder's output, or load it.

The rule, as each waiting caller applies it on every look (``turn``):

1. the output landed → load it;
2. the claim is ours now (the holder released it unfinished, or it expired:
   the holder died or overran its TTL) → compute;
3. the bound has passed → compute (a live holder is slower than the bound:
   a duplicate computation, never a wrong tensor); ``get_or_compute`` first
   waits once more, up to the bound, when the claim is still held then: it
   most likely changed hands (``GetOrCompute._wait_for_others``);
4. otherwise wait, looking again after a growing pause (``pause``).

A claim store that cannot answer counts as "ours": the caller computes, as
it would without claims.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..claims import ClaimStore, open_directory_claims
from ..config import ECConfig


class Turn(enum.Enum):
    """What a caller does next with an entry no tier held when it looked."""

    COMPUTE = "compute"  # ours: claim won, no store answered, or the wait ran out
    WAIT = "wait"  # another instance computes it and its output has not landed yet
    LOAD = "load"  # the output landed: read it


@dataclass(frozen=True)
class ClaimWait:
    """How a caller that met another instance's live claim waits for its output."""

    bound_s: float  # the most a caller waits for another's output before computing
    first_pause_s: float = 0.002
    max_pause_s: float = 0.025
    growth: float = 1.5

    def after_claim(self, won: bool) -> Turn:
        """The store answered a claim: ours (or unanswerable) → compute, else wait."""
        return Turn.COMPUTE if won else Turn.WAIT

    def turn(
        self, now: float, deadline: float, claim_free: bool | None, landed: Callable[[], bool]
    ) -> Turn:
        """The rule above. ``claim_free``: the answer to a claim asked again while
        waiting (True: now ours), None if none was asked or answered. ``landed``
        is called after that answer was known, so an output stored before its
        holder released the claim is always seen."""
        if landed():
            return Turn.LOAD
        if claim_free or now >= deadline:
            return Turn.COMPUTE
        return Turn.WAIT

    def pause(self, looks: int, now: float, deadline: float) -> float:
        """Seconds until the next look, after ``looks`` looks: grows, never past the bound."""
        grown = self.first_pause_s * self.growth ** min(looks, 32)
        return max(0.0, min(grown, self.max_pause_s, deadline - now))


def claim_store_factory(config: ECConfig) -> Callable[[], ClaimStore | None] | None:
    """Where instances announce their computations: the remote store if it
    offers claims, else a directory beside the disk tier's; None: neither."""
    disk = config.local_disk
    if config.remote.url is None and not disk:
        return None

    def open_store() -> ClaimStore | None:
        if config.remote.url is not None:
            from ..remote.catalog import open_catalog

            catalog = open_catalog(config)
            if isinstance(catalog, ClaimStore):
                return catalog
            if catalog is not None:
                catalog.close()
        return open_directory_claims(disk, config.local_disk_group_shared) if disk else None

    return open_store


class Flight:
    """One computation of one entry in this process: its leader's outcome."""

    __slots__ = ("done", "followers", "leader", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.leader = threading.get_ident()  # a follower in this thread would wait for itself
        self.followers = 0
        self.result: Any = None  # None once done: the leader failed (followers retry)


class LocalFlights:
    """Entries being computed in this process, by name: one leader each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Flight] = {}

    def join(self, name: str) -> tuple[Flight, bool]:
        """The flight of ``name`` and whether the caller leads it (it was new)."""
        with self._lock:
            flight = self._flights.get(name)
            if flight is not None:
                flight.followers += 1
                return flight, False
            flight = self._flights[name] = Flight()
            return flight, True

    def land(
        self, name: str, flight: Flight, result: Any, share: Callable[[Any], Any] | None = None
    ) -> None:
        """The leader's end: ``result`` for its followers (None: failed, they retry).

        ``share(result)`` is what followers get, when there are any: a copy of
        their own, so the leader's caller may change the one it returns.
        """
        with self._lock:
            if self._flights.get(name) is flight:
                del self._flights[name]
            followers = flight.followers  # none can join once it is out of the table
        try:
            if followers and result is not None and share is not None:
                result = share(result)
        except Exception:  # no copy for them (out of memory): they ask again
            result = None
        finally:
            flight.result = result
            flight.done.set()
