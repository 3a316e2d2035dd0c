"""Deferred requests: what each still needs, what it waits on, and what moved.

The scheduler decides each item (``scheduler.py``); this keeps the books of
the requests those decisions defer, so that a deferred request costs nothing
per step until something it waits on changes: the item table reports items
that moved (an answer, a give-up) and the scheduler wakes items whose
deadline passed or whose remote check ended; only the requests waiting on
those items look at them again (``settle``). While a request waits on
stagings over the stage channel, ``settle`` waits for the workers' answers
within the step's budget.

It also holds the requests reported unavailable (an item of theirs could not
be fetched on a consumer-only instance) until vLLM fails them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .items import ItemTable
from .step_wait import StepWait


@dataclass
class Wait:
    """A deferred request: what it needs, and what it still waits on."""

    request: Any  # vLLM's Request: one object per request, across steps
    needed: dict[str, int]  # identifier -> estimated bytes, of items still to compute
    rows: dict[str, int] = field(default_factory=dict)  # identifier -> its placeholders
    pending: set[str] = field(default_factory=set)  # answered WAIT
    direct: set[str] = field(default_factory=set)  # pending, staging over the stage channel
    changed: set[str] = field(default_factory=set)  # moved (or due) since last looked at
    # Computed for want of room (``RequestWaits.compute``): final while it waits.
    # Looked at again once its given-up prefetch moved, it would be queued anew
    # behind other requests'.
    computed: set[str] = field(default_factory=set)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def record(self, identifier: str, *, waits: bool, direct: bool) -> None:
        """The decision about ``identifier``: the request waits on it (over the
        stage channel if ``direct``), or not."""
        if waits:
            self.pending.add(identifier)
            if direct:
                self.direct.add(identifier)
            else:
                self.direct.discard(identifier)
        else:
            self.pending.discard(identifier)
            self.direct.discard(identifier)


# The scheduler's look at some of a request's items: decide each, order what can start.
Look = Callable[[Wait, Iterable[str]], None]


class RequestWaits:
    """The deferred requests of one scheduler, by request id."""

    def __init__(
        self,
        items: ItemTable,
        step: StepWait,
        bytes_per_embed: int,
        look: Look,
        poll: Callable[[float], None],
    ) -> None:
        self._items = items
        self._step = step
        # Encoder outputs are [num_embeds, hidden]: an estimate for the byte bound.
        self._bytes_per_embed = bytes_per_embed
        self._look = look
        self._poll = poll  # applies what the workers said, waiting up to its timeout
        self._waiting: dict[str, Wait] = {}
        self._needed_by: dict[str, set[str]] = {}  # identifier -> deferred requests needing it
        self._woken: set[str] = set()  # items due or answered, not moved: looked at again
        # request id -> (its items, the token after its last item)
        self._mm_end: dict[str, tuple[int, int]] = {}
        self._unavailable: set[str] = set()  # request ids for take_unavailable
        self._failing: set[str] = set()  # reported unavailable, held until vLLM fails them

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def find(self, request: Any) -> Wait | None:
        """``request``'s record, if it waits (an id used again starts afresh)."""
        request_id = request.request_id
        wait = self._waiting.get(request_id)
        if wait is not None and wait.request is not request:
            self.forget(request_id)
            self._mm_end.pop(request_id, None)
            return None
        return wait

    def still_needed(self, request: Any, num_computed_tokens: int) -> dict[str, int]:
        """The request's items not computed yet, with their estimated bytes."""
        request_id = request.request_id
        count, end = self._mm_end.get(request_id, (-1, 0))
        if count != len(request.mm_features):  # new, or a streaming session's next chunk
            end = max(
                (f.mm_position.offset + f.mm_position.length for f in request.mm_features),
                default=0,
            )
            self._mm_end[request_id] = (len(request.mm_features), end)
        if num_computed_tokens >= end:
            return {}
        needed = {}
        for feature in request.mm_features:
            pos = feature.mm_position
            if pos.offset + pos.length > num_computed_tokens:
                needed[feature.identifier] = pos.get_num_embeds() * self._bytes_per_embed
        return needed

    def start(self, request: Any, needed: dict[str, int]) -> Wait:
        """Keep the books of ``request``, which needs ``needed``."""
        rows = {f.identifier: f.mm_position.get_num_embeds() for f in request.mm_features}
        wait = self._waiting[request.request_id] = Wait(request, needed, rows)
        for identifier in needed:
            self._needed_by.setdefault(identifier, set()).add(request.request_id)
        return wait

    def forget(self, request_id: str) -> None:
        wait = self._waiting.pop(request_id, None)
        if wait is None:
            return
        for identifier in wait.needed:
            waiting = self._needed_by.get(identifier)
            if waiting is not None:
                waiting.discard(request_id)
                if not waiting:
                    del self._needed_by[identifier]

    def compute(self, identifier: str, request_ids: Iterable[str]) -> None:
        """The deferred ones of ``request_ids`` compute ``identifier`` (its prefetch
        was given up): none of them waits on it again."""
        for request_id in request_ids:
            wait = self._waiting.get(request_id)
            if wait is not None:
                wait.computed.add(identifier)
                wait.changed.add(identifier)

    def needs(self, identifier: str) -> bool:
        """Whether a deferred request still needs ``identifier``."""
        return identifier in self._needed_by

    def finished(self, request_id: str) -> None:
        """vLLM is done with the request: nothing of it is kept."""
        self.forget(request_id)
        self._mm_end.pop(request_id, None)
        self._failing.discard(request_id)

    # -- what moved ----------------------------------------------------------

    def wake_later(self, identifiers: Iterable[str]) -> None:
        """Items due or answered without moving: their requests look at them again."""
        self._woken.update(identifiers)

    def wake(self) -> None:
        """Hand each item moved (or woken) since the last call to the requests needing it."""
        changed = self._items.take_changed()
        if self._woken:
            changed |= self._woken
            self._woken = set()
        for identifier in changed:
            for request_id in self._needed_by.get(identifier, ()):
                self._waiting[request_id].changed.add(identifier)

    def drop_news_if_idle(self) -> None:
        """Nobody to wake: what moved concerns no request."""
        if not self._waiting:
            self._items.take_changed()
            self._woken.clear()

    def settle(self, wait: Wait) -> None:
        """Look again at what moved for this request; wait within the step's budget
        while it waits on stagings over the stage channel."""
        while wait.request_id not in self._failing:  # failed: vLLM ends it, nothing to look at
            self.wake()
            if wait.changed:
                changed, wait.changed = wait.changed, set()
                self._look(wait, changed)
            elif not (wait.direct and self._await_answers(wait)):
                return

    def _await_answers(self, wait: Wait) -> bool:
        """Wait for the workers' answers about ``wait``'s stagings, within this step's
        budget and never past their deadline; False if no time was left.

        With nothing else running or let through this step, a wait stalls nobody
        (``idle_stage_wait_s``); otherwise it delays their step as a read inside
        it would (``busy_stage_wait_s``).
        """
        budget = self._step.left()
        if budget <= 0:
            return False  # the step's next poll reads the answer (and sends the order)
        started = time.monotonic()
        soonest = min(self._items.get(identifier).deadline for identifier in wait.direct)
        budget = min(budget, soonest - started)
        if budget <= 0:
            return False  # past a deadline: given up when next looked at
        left = budget
        self._poll(0.0)
        while left > 0:
            self.wake()
            if wait.changed:
                break
            self._poll(left)
            left = budget - (time.monotonic() - started)
        self._step.waited += time.monotonic() - started
        return True

    # -- requests that cannot be served --------------------------------------

    def fail(self, request_ids: set[str]) -> None:
        """Report ``request_ids`` unavailable to vLLM (and keep them deferred until it
        fails them)."""
        self._unavailable |= request_ids
        self._failing |= request_ids

    def failing(self, request_id: str) -> bool:
        return request_id in self._failing

    def take_unavailable(self) -> set[str]:
        unavailable, self._unavailable = self._unavailable, set()
        return unavailable
