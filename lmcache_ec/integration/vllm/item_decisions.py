"""One item's answer for a request the scheduler looks at (``ItemAnswer``).

HELD: staged on every rank, or in vLLM's encoder cache. WAIT: on its way (a
lookup answered within the step's budget, a prefetch queued or staging, the
output of another instance's claim). COMPUTE: the encoder runs for it.

An item no state holds yet goes through, in order: a fetch of it that failed
a moment ago (compute); no weights known, or an identifier never stored
(compute); a claim on it (``encode_claims.py``); the tiers' answer
(``index.py``), and a hit is queued for prefetch within the bounds and the
request's room (``prefetch.py``). With ``in_step_reads`` a hit is approved at
once and read inside the step.
"""

from __future__ import annotations

from typing import Protocol

from .connector_options import ConnectorSettings
from .encode_claims import CLAIM_STATES, ClaimDecision, EncodeClaims
from .index import PENDING, TierIndex
from .items import HELD_STATES, ItemAnswer, ItemState, ItemTable
from .prefetch import PrefetchQueue, Room
from .step_wait import StepWait
from .worker_link import LinkOwner

S = ItemState
# Fetched for one request's rows: a request with other rows cannot take it.
_FETCHED = (S.QUEUED, S.STAGING, S.READY, S.PROMISED)


class DecisionOwner(LinkOwner, Protocol):
    """What the decisions ask of their scheduler (``scheduler.py``), beyond the link's."""

    def give_up(
        self,
        identifier: str,
        now: float,
        why: str,
        *,
        fetch_failed: bool = True,
        waiters_compute: bool = False,
    ) -> None:
        """Stop waiting for ``identifier``: compute it, or fail its requests."""

    def fail(self, identifier: str, now: float) -> None:
        """Compute ``identifier`` and hold it off the tiers for a while."""

    def reject(self, request_id: str, identifier: str, rows: int, queued_rows: int) -> None:
        """Fail ``request_id``: ``identifier`` is fetched for other rows than its own."""


class ItemDecisions:
    """Decide one item at a time; every move goes through the item table."""

    def __init__(
        self,
        owner: DecisionOwner,
        settings: ConnectorSettings,
        items: ItemTable,
        index: TierIndex,
        prefetch: PrefetchQueue,
        step: StepWait,
        claims: EncodeClaims | None,
        *,
        held_back: set[str],
    ) -> None:
        self.owner = owner
        self.settings = settings
        self.items = items
        self.index = index
        self.prefetch = prefetch
        self.step = step
        self.claims = claims
        # The scheduler's: stagings an idle V1 step kept from the workers.
        self.held_back = held_back

    def decide(
        self,
        identifier: str,
        now: float,
        nbytes: int,
        request_id: str,
        room: Room,
        rows: int = 0,
        *,
        may_wait: bool = True,
    ) -> ItemAnswer:
        """``identifier``'s answer for ``request_id``, which has ``room`` left and
        ``rows`` placeholders for it (0: not said); never WAIT unless ``may_wait``."""
        state = self.items.state(identifier)
        queued_rows = self.prefetch.rows(identifier)
        if rows and queued_rows and queued_rows != rows and state in _FETCHED:
            # Its copy could not be placed for this request (vLLM would raise).
            self.owner.reject(request_id, identifier, rows, queued_rows)
            return ItemAnswer.COMPUTE
        if state in HELD_STATES:
            return ItemAnswer.HELD
        if self.settings.in_step_reads:
            return self._approve_at_once(identifier, now)
        if not may_wait:
            return ItemAnswer.COMPUTE
        if state is S.QUEUED:
            if now < self.items.get(identifier).deadline:
                return ItemAnswer.WAIT
            # Never ordered: nothing failed, so it is computed (on a consumer too, as
            # an item beyond a request's room is) and not held off the tiers; every
            # request waiting on it computes it, rather than queue it again.
            why = "no room to prefetch it in time"
            self.owner.give_up(identifier, now, why, fetch_failed=False, waiters_compute=True)
            return ItemAnswer.COMPUTE
        if state is S.STAGING:
            item = self.items.get(identifier)
            if identifier in self.held_back:
                # An idle V1 step: the orders never reached the workers.
                self.owner.give_up(identifier, now, "idle step", fetch_failed=False)
                return ItemAnswer.COMPUTE
            if now < item.deadline:
                return ItemAnswer.WAIT
            self.owner.give_up(identifier, now, "staging timed out")
            return ItemAnswer.COMPUTE
        return self._start_prefetch(identifier, now, nbytes, request_id, room, rows)

    def _approve_at_once(self, identifier: str, now: float) -> ItemAnswer:
        """``in_step_reads``: a tier hit is approved now and read inside the step."""
        if self.owner.weights is None or not self.settings.persistable(identifier):
            return ItemAnswer.COMPUTE
        tier = self._lookup(identifier, now)
        if tier == PENDING:  # the same existence check as with prefetch
            expired = now >= self.items.get(identifier).deadline
            return ItemAnswer.COMPUTE if expired else ItemAnswer.WAIT
        if tier is None:
            return ItemAnswer.COMPUTE
        self.items.move(identifier, S.READY, now + self.settings.stage_timeout_s)
        return ItemAnswer.HELD

    def _lookup(self, identifier: str, now: float) -> str | None:
        """The index's answer; PENDING (state LOOKING_UP) while the remote check runs."""
        tier = self.index.lookup(identifier)
        looking = self.items.state(identifier) is S.LOOKING_UP
        if tier == PENDING and not looking:
            self.items.move(identifier, S.LOOKING_UP, now + self.settings.remote_lookup_timeout_s)
        elif tier != PENDING and looking:
            self.items.move(identifier, S.UNKNOWN)
        if tier != PENDING:
            self.owner.mark(identifier, "lookup")
        return tier

    def _start_prefetch(
        self, identifier: str, now: float, nbytes: int, request_id: str, room: Room, rows: int
    ) -> ItemAnswer:
        """Queue a prefetch of ``identifier`` if the tiers hold it (WAIT once queued)."""
        if now < self.items.retry_at(identifier):
            return ItemAnswer.COMPUTE  # a fetch of it failed a moment ago
        self.items.allow_retry(identifier)
        if self.owner.weights is None or not self.settings.persistable(identifier):
            return ItemAnswer.COMPUTE
        if self.items.state(identifier) in CLAIM_STATES:
            return self._encode_or_wait(identifier, now, nbytes, request_id, room, rows)
        tier = self._lookup(identifier, now)
        if tier == PENDING:
            deadline = self.items.get(identifier).deadline
            # Within this step's budget: the answer is a round trip away.
            if self.step.wait(
                lambda seconds: self.index.wait_answer(identifier, seconds), deadline - now
            ):
                tier = self._lookup(identifier, now)
            if tier == PENDING:
                return ItemAnswer.COMPUTE if now >= deadline else ItemAnswer.WAIT
        if tier is None:
            return self._encode_or_wait(identifier, now, nbytes, request_id, room, rows)
        return self._enqueue(identifier, now, nbytes, room, rows)

    def _encode_or_wait(
        self, identifier: str, now: float, nbytes: int, request_id: str, room: Room, rows: int
    ) -> ItemAnswer:
        """No tier holds ``identifier``: encode it here, or wait for the instance
        that claimed it (``encode_claims.py``) and prefetch its output."""
        if self.claims is None:
            return ItemAnswer.COMPUTE
        decision = self.claims.decide(identifier, now, request_id)
        if decision is ClaimDecision.FETCH:
            return self._enqueue(identifier, now, nbytes, room, rows)
        return ItemAnswer.COMPUTE if decision is ClaimDecision.ENCODE_HERE else ItemAnswer.WAIT

    def _enqueue(
        self, identifier: str, now: float, nbytes: int, room: Room, rows: int
    ) -> ItemAnswer:
        if not self.prefetch.fits_at_all(nbytes):
            self.owner.count("prefetch_too_large")
            self.owner.fail(identifier, now)
            return ItemAnswer.COMPUTE
        if not room.fits(nbytes):
            self.owner.count("prefetch_beyond_request_room")  # see prefetch.Room
            return ItemAnswer.COMPUTE
        deadline = now + self.settings.stage_timeout_s
        self.items.move(identifier, S.QUEUED, deadline)
        self.prefetch.enqueue(identifier, deadline, nbytes, rows)
        self.owner.count("prefetch_queued")
        return ItemAnswer.WAIT
