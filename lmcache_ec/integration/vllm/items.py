"""The scheduler's record of each multimodal item: its state, and the one table that writes it.

One image, from unknown to loaded (the decisions are in ``scheduler.py``)::

  UNKNOWN --(a tier holds it)--> QUEUED --(room in flight)--> STAGING
    --(every rank staged it)--> READY --(has_cache_item)--> PROMISED
    --(update_state_after_alloc)--> LOADED --(vLLM frees it)--> UNKNOWN

An item the scheduler knows nothing about has no record (``UNKNOWN``). The
states, and what the deadline of each means::

  LOOKING_UP  the remote existence check is pending   stop waiting: compute it
  CLAIMING    asking the shared claim store            stop waiting: compute it
  CLAIMED     this instance won the claim: it encodes  (no deadline)
  AWAITING    another instance encodes it              stop waiting: compute it
  QUEUED      a prefetch waits for in-flight room      give up: compute it
  STAGING     the workers fetch it into memory         give up: compute it
  READY       staged on every rank                     release it, unused
  PROMISED    has_cache_item said yes this step        (READY's, kept)
  LOADED      loaded from the tiers into vLLM's encoder cache (until vLLM frees it)
  RESIDENT    computed here, in vLLM's encoder cache (until vLLM frees it)
  FAILED      a fetch was given up: computed here      fetch it again from then on

``ALLOWED`` lists every transition; any other is a bug and raises
``IllegalTransition`` (``docs/vllm.md`` draws the same table, and a test
holds the two equal). A failed fetch also sets a retry time kept apart from
the state: an item computed after it is not fetched again before then, even
once vLLM frees it.

The table also says what changed, so that the scheduler looks again only at
what concerns a waiting request: ``take_changed`` (items moved since the last
call) and ``take_due`` (items whose deadline passed).
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, replace


class ItemState(enum.Enum):
    UNKNOWN = "unknown"
    LOOKING_UP = "looking_up"
    CLAIMING = "claiming"
    CLAIMED = "claimed"
    AWAITING = "awaiting"
    QUEUED = "queued"
    STAGING = "staging"
    READY = "ready"
    PROMISED = "promised"
    LOADED = "loaded"
    RESIDENT = "resident"
    FAILED = "failed"


S = ItemState
_GIVE_UP = {S.UNKNOWN, S.FAILED, S.RESIDENT}  # dropped, given up, or computed after all
ALLOWED: dict[ItemState, frozenset[ItemState]] = {
    S.UNKNOWN: frozenset({S.LOOKING_UP, S.CLAIMING, S.QUEUED, S.READY, S.FAILED, S.RESIDENT}),
    S.LOOKING_UP: frozenset({S.UNKNOWN, S.RESIDENT}),  # answered: decided afresh
    S.CLAIMING: frozenset({S.UNKNOWN, S.CLAIMED, S.AWAITING, S.RESIDENT}),
    S.CLAIMED: frozenset({S.UNKNOWN, S.RESIDENT}),
    S.AWAITING: frozenset({S.QUEUED, *_GIVE_UP}),
    S.QUEUED: frozenset({S.STAGING, *_GIVE_UP}),
    S.STAGING: frozenset({S.READY, *_GIVE_UP}),
    # READY -> READY: its deadline moved on, for a request that still waits on it.
    S.READY: frozenset({S.READY, S.PROMISED, *_GIVE_UP}),
    S.PROMISED: frozenset({S.READY, S.LOADED, S.UNKNOWN, S.FAILED}),
    S.LOADED: frozenset({S.UNKNOWN}),
    S.RESIDENT: frozenset({S.UNKNOWN}),
    # FAILED -> LOOKING_UP, READY: with in_step_reads, approved at once
    S.FAILED: frozenset({S.UNKNOWN, S.RESIDENT, S.LOOKING_UP, S.READY}),
}


# State groups the scheduler decides by.
FETCHING = (S.QUEUED, S.STAGING, S.READY, S.PROMISED)  # a prefetch is under way or done
IN_VLLM = (S.LOADED, S.RESIDENT)  # in vLLM's encoder cache, as far as the scheduler knows
# Asked about for a request: a remote lookup, or a claim it lost or has not won yet.
ASKED_ABOUT = (S.LOOKING_UP, S.CLAIMING, S.AWAITING)
HELD_STATES = (S.READY, S.PROMISED, *IN_VLLM)  # nothing to wait for


class ItemAnswer(enum.Enum):
    """What one item of a request needs before the request may be scheduled."""

    HELD = "held"  # staged on every rank, or in vLLM's encoder cache
    COMPUTE = "compute"  # nothing to wait for: the encoder runs for it
    WAIT = "wait"  # on its way: the request is deferred


class IllegalTransition(RuntimeError):
    """A move ``ALLOWED`` does not list: a bug in the scheduler."""


@dataclass(frozen=True, slots=True)
class Item:
    state: ItemState
    deadline: float = 0.0
    ranks: int = 0  # STAGING: ranks that reported it staged
    direct: bool = False  # STAGING: ordered over the stage channel
    # STAGING: the number of its stage order (on its path: ``direct`` or step
    # metadata); only an answer to that order counts.
    order: int = 0


class ItemTable:
    """Records by identifier, identifiers by state, and what changed since last asked."""

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}
        self._by_state: dict[ItemState, set[str]] = {state: set() for state in ItemState}
        self._retry_at: dict[str, float] = {}  # no fetch before (a failed one); outlives states
        self._deadlines: list[tuple[float, str]] = []  # a heap; stale entries are skipped
        self._changed: set[str] = set()

    # -- reading -------------------------------------------------------------

    def get(self, identifier: str) -> Item | None:
        return self._items.get(identifier)

    def state(self, identifier: str) -> ItemState:
        item = self._items.get(identifier)
        return S.UNKNOWN if item is None else item.state

    def having(self, *states: ItemState) -> list[str]:
        """Identifiers in any of ``states`` (a copy: moving them is safe)."""
        return [identifier for state in states for identifier in self._by_state[state]]

    def count(self, state: ItemState) -> int:
        return len(self._by_state[state])

    def retry_at(self, identifier: str) -> float:
        """When a fetch of ``identifier`` may be tried again (0: now)."""
        return self._retry_at.get(identifier, 0.0)

    def take_changed(self) -> set[str]:
        """Identifiers moved since the last call."""
        changed, self._changed = self._changed, set()
        return changed

    def take_due(self, now: float) -> list[str]:
        """Identifiers whose deadline passed since the last call (each deadline once)."""
        while self._retry_at:  # passed retry times, oldest first (written in time order)
            first = next(iter(self._retry_at))
            if self._retry_at[first] > now:
                break
            del self._retry_at[first]
        due = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, identifier = heapq.heappop(self._deadlines)
            item = self._items.get(identifier)
            if item is not None and item.deadline == deadline:
                due.append(identifier)
        return due

    # -- writing: the only place records change --------------------------------

    def move(self, identifier: str, state: ItemState, deadline: float = 0.0) -> None:
        """Change an item's state (``UNKNOWN`` drops its record; an item with no
        record is already there). A move ``ALLOWED`` does not list raises."""
        self._write(identifier, state, deadline, direct=False)

    def stage(self, identifier: str, deadline: float, *, direct: bool, order: int = 0) -> None:
        """QUEUED -> STAGING on stage order ``order``, sent over the stage channel
        (``direct``) or in step metadata."""
        self._write(identifier, S.STAGING, deadline, direct=direct, order=order)

    def promise(self, identifier: str) -> None:
        """READY -> PROMISED, the deadline kept."""
        self._write(identifier, S.PROMISED, self._items[identifier].deadline, direct=False)

    def add_ranks(self, identifier: str, ranks: int) -> int:
        """``ranks`` more ranks staged a STAGING item: how many have in all."""
        item = self._items[identifier]
        if item.state is not S.STAGING:
            raise IllegalTransition(f"ranks staged for an item {item.state.value}")
        self._items[identifier] = replace(item, ranks=item.ranks + ranks)
        return item.ranks + ranks

    def fail(self, identifier: str, retry_at: float) -> None:
        """A fetch was given up: FAILED, and no fetch again before ``retry_at``."""
        self._write(identifier, S.FAILED, retry_at, direct=False)
        self._retry_at.pop(identifier, None)  # to the end: the map stays in time order
        self._retry_at[identifier] = retry_at

    def allow_retry(self, identifier: str) -> None:
        """The retry time of ``identifier`` passed: a FAILED record is dropped."""
        self._retry_at.pop(identifier, None)
        if self.state(identifier) is S.FAILED:
            self.move(identifier, S.UNKNOWN)

    def forget_retries(self) -> None:
        """Failures say nothing any more (new weights): FAILED items are forgotten."""
        self._retry_at.clear()
        for identifier in self.having(S.FAILED):
            self.move(identifier, S.UNKNOWN)

    def _write(
        self, identifier: str, state: ItemState, deadline: float, *, direct: bool, order: int = 0
    ) -> None:
        old = self._items.get(identifier)
        old_state = S.UNKNOWN if old is None else old.state
        if state is S.UNKNOWN and old is None:
            return
        if state not in ALLOWED[old_state]:
            raise IllegalTransition(
                f"item {identifier:.24s}: {old_state.value} -> {state.value} is not allowed"
            )
        self._by_state[old_state].discard(identifier)
        self._changed.add(identifier)
        if state is S.UNKNOWN:
            del self._items[identifier]
            return
        self._items[identifier] = Item(state, deadline, 0, direct, order)
        self._by_state[state].add(identifier)
        if deadline and (old is None or old.deadline != deadline):
            heapq.heappush(self._deadlines, (deadline, identifier))

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)
