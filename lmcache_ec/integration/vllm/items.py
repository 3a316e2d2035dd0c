"""The scheduler's record of each multimodal item: one state, its deadline.

An item the scheduler knows nothing about has no record (``UNKNOWN``). The
states, and what the deadline of each means::

  LOOKING_UP  the remote existence check is pending   stop waiting: compute it
  CLAIMING    asking the shared claim store            stop waiting: compute it
  CLAIMED     this instance won the claim: it encodes  (no deadline)
  AWAITING    another instance encodes it              stop waiting: compute it
  QUEUED      a prefetch waits for in-flight room      give up: compute it
  STAGING     the workers fetch it into memory         give up: compute it
  READY       staged on every rank                     release it, unused
  PROMISED    has_cache_item said yes this step        (no deadline)
  RESIDENT    in vLLM's encoder cache (loaded or computed; until vLLM frees it)
  FAILED      a prefetch failed: computed, not fetched  retry the tiers

Transitions (``ALLOWED``)::

  UNKNOWN    -> LOOKING_UP | CLAIMING | QUEUED | READY* | FAILED | RESIDENT
  LOOKING_UP -> UNKNOWN | CLAIMING | QUEUED | READY* | FAILED | RESIDENT
  CLAIMING   -> UNKNOWN | CLAIMED | AWAITING | RESIDENT
  CLAIMED    -> UNKNOWN | RESIDENT
  AWAITING   -> UNKNOWN | QUEUED | FAILED | RESIDENT
  QUEUED     -> UNKNOWN | STAGING | FAILED | RESIDENT
  STAGING    -> UNKNOWN | READY | FAILED | RESIDENT
  READY      -> UNKNOWN | PROMISED | FAILED | RESIDENT
  PROMISED   -> UNKNOWN | READY | FAILED | RESIDENT
  RESIDENT   -> UNKNOWN | FAILED
  FAILED     -> UNKNOWN | RESIDENT | LOOKING_UP* | READY*

  (* with ``in_step_reads``: approved at once, read inside the step)

``retry_after`` outlives the state: an item computed after a failed prefetch
is not fetched again before it, even once vLLM frees it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)


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
    RESIDENT = "resident"
    FAILED = "failed"


S = ItemState
_ANY_FETCH = {S.UNKNOWN, S.FAILED, S.RESIDENT}
ALLOWED: dict[ItemState, frozenset[ItemState]] = {
    S.UNKNOWN: frozenset({S.LOOKING_UP, S.CLAIMING, S.QUEUED, S.READY, S.FAILED, S.RESIDENT}),
    S.LOOKING_UP: frozenset({S.UNKNOWN, S.CLAIMING, S.QUEUED, S.READY, S.FAILED, S.RESIDENT}),
    S.CLAIMING: frozenset({S.UNKNOWN, S.CLAIMED, S.AWAITING, S.RESIDENT}),
    S.CLAIMED: frozenset({S.UNKNOWN, S.RESIDENT}),
    S.AWAITING: frozenset({S.UNKNOWN, S.QUEUED, S.FAILED, S.RESIDENT}),
    S.QUEUED: frozenset({S.STAGING, *_ANY_FETCH}),
    S.STAGING: frozenset({S.READY, *_ANY_FETCH}),
    S.READY: frozenset({S.PROMISED, *_ANY_FETCH}),
    S.PROMISED: frozenset({S.READY, *_ANY_FETCH}),
    S.RESIDENT: frozenset({S.UNKNOWN, S.FAILED}),
    S.FAILED: frozenset({S.UNKNOWN, S.RESIDENT, S.LOOKING_UP, S.READY}),  # *: in_step_reads
}


@dataclass
class Item:
    state: ItemState
    deadline: float = 0.0
    retry_after: float = 0.0  # no prefetch before (a failed one)
    ranks: int = 0  # STAGING: ranks that reported it staged
    direct: bool = False  # STAGING: ordered over the stage channel


class ItemTable:
    """Records by identifier, and identifiers by state (for per-step sweeps)."""

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}
        self._by_state: dict[ItemState, set[str]] = {state: set() for state in ItemState}

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

    def move(self, identifier: str, state: ItemState, deadline: float = 0.0) -> Item | None:
        """Change an item's state (only ``promise`` besides). UNKNOWN drops the record, unless a
        ``retry_after`` is still to come (then it is FAILED)."""
        item = self._items.get(identifier)
        if item is None:
            if state is S.UNKNOWN:
                return None
            if state not in ALLOWED[S.UNKNOWN]:
                logger.warning("Item %.24s: unexpected transition unknown -> %s", identifier, state)
            item = self._items[identifier] = Item(state, deadline)
            self._by_state[state].add(identifier)
            return item
        old = item.state
        if state not in ALLOWED[old] and state is not old:
            logger.warning("Item %.24s: unexpected transition %s -> %s", identifier, old, state)
        self._by_state[old].discard(identifier)
        if state is S.UNKNOWN:
            if item.retry_after <= 0:
                del self._items[identifier]
                return None
            state, deadline = S.FAILED, item.retry_after
        item.state, item.deadline = state, deadline
        item.ranks, item.direct = 0, False
        self._by_state[state].add(identifier)
        return item

    def promise(self, identifier: str, item: Item) -> None:
        """READY -> PROMISED, the deadline kept: ``move`` trimmed for has_cache_item's path."""
        self._by_state[S.READY].discard(identifier)
        self._by_state[S.PROMISED].add(identifier)
        item.state = S.PROMISED

    def forget_retries(self) -> None:
        """Failures say nothing any more (new weights): FAILED items are forgotten."""
        for item in self._items.values():
            item.retry_after = 0.0
        for identifier in self.having(S.FAILED):
            self.move(identifier, S.UNKNOWN)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)
