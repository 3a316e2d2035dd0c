"""Scheduler side of encode claims: one encode per item across instances.

On an ``ec_both`` instance, an item no tier holds is first *claimed* in a
store the instances share (``lmcache_ec.claims``). If another instance holds
a live claim, it is encoding the item, and the request is deferred until the
output lands (then prefetched) or ``claim_wait_s`` passes (then encoded
here). Claims are withdrawn when the output is saved or the request ends
unencoded, and expire on their own.

Claims are made by the ``ClaimAgent`` and the next move is chosen by the
``ClaimWait`` rule of ``lmcache_ec.storage.single_flight``, which ``ECCache.get_or_compute``
follows too; here the rule is applied once per step, and a waiting item does
not claim again (it loads the output, or computes once the bound passed).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from ...claims import ClaimAgent
from ...storage.single_flight import ClaimWait, Turn
from .connector_options import ConnectorSettings
from .index import PENDING, TierIndex
from .items import ItemState, ItemTable
from .step_wait import StepWait

S = ItemState
CLAIM_STATES = (S.CLAIMING, S.CLAIMED, S.AWAITING)
_MAX_HELD = 4096  # claims remembered for release; older ones are left to expire


class ClaimDecision(enum.Enum):
    """What to do about an item no tier holds (``EncodeClaims.decide``)."""

    ENCODE_HERE = "encode_here"  # this instance encodes it
    WAIT = "wait"  # another instance encodes it (at most claim_wait_s)
    FETCH = "fetch"  # its output landed: prefetch it


class EncodeClaims:
    def __init__(
        self,
        agent: ClaimAgent,
        items: ItemTable,
        index: TierIndex,
        settings: ConnectorSettings,
        step: StepWait,
        count: Callable[[str], None],
    ) -> None:
        self.agent = agent
        self.items = items
        self.index = index
        self.settings = settings
        self.step = step
        self._count = count
        # identifier -> (request it was claimed for, the name claimed): released by
        # that name, which a weights change (a new identity) no longer computes.
        self._held: dict[str, tuple[str, str]] = {}
        self.rule = ClaimWait(settings.claim_wait_s)

    def decide(self, identifier: str, now: float, request_id: str) -> ClaimDecision:
        """For an item no tier holds: encode it here, wait while another instance
        encodes it (at most ``claim_wait_s``), or fetch its output once it landed."""
        state = self.items.state(identifier)
        if state is S.CLAIMED:
            return ClaimDecision.ENCODE_HERE
        if state is S.AWAITING:
            turn = self.rule.turn(
                now,
                self.items.get(identifier).deadline,
                None,
                lambda: self.index.lookup(identifier, fresh=True) not in (None, PENDING),
            )
            if turn is Turn.LOAD:
                self._count("claim_waits_answered")
                return ClaimDecision.FETCH
            # COMPUTE: waited long enough, encode it here
            return ClaimDecision.ENCODE_HERE if turn is Turn.COMPUTE else ClaimDecision.WAIT
        name = self.index.storage_name(identifier)
        if state is not S.CLAIMING:
            self.items.move(identifier, S.CLAIMING, now + self.settings.claim_wait_s)
        won = self.agent.ask(name)
        if won is None and self.step.wait(
            lambda seconds: self.agent.wait_answer(name, seconds),
            self.items.get(identifier).deadline - now,
        ):
            won = self.agent.ask(name)
        if won is None:  # unanswered: wait within the bound, then encode
            expired = now >= self.items.get(identifier).deadline
            return ClaimDecision.ENCODE_HERE if expired else ClaimDecision.WAIT
        if self.rule.after_claim(won) is Turn.COMPUTE:
            self.items.move(identifier, S.CLAIMED)
            self._held[identifier] = (request_id, name)
            if len(self._held) > _MAX_HELD:  # saves dropped: those expire
                del self._held[next(iter(self._held))]
            self._count("claims_won")
            return ClaimDecision.ENCODE_HERE
        self.items.move(identifier, S.AWAITING, now + self.settings.claim_wait_s)
        self._count("claims_lost")
        return ClaimDecision.WAIT

    def release(self, identifier: str) -> None:
        """The item's output landed (or will not come from here): others go ahead."""
        held = self._held.pop(identifier, None)
        if held is not None:
            self.agent.release(held[1])
        if self.items.state(identifier) in CLAIM_STATES:
            self.items.move(identifier, S.UNKNOWN)

    def release_for(self, request_id: str) -> None:
        """Claims made for ``request_id`` that it never encoded (it ended first)."""
        for identifier, (holder, _) in list(self._held.items()):
            if holder == request_id and self.items.state(identifier) is S.CLAIMED:
                self.release(identifier)

    def release_all(self) -> None:
        for identifier in list(self._held):
            self.release(identifier)

    def close(self, timeout: float) -> None:
        """Withdraw claims still held (their outputs will not land from here),
        within ``timeout`` seconds."""
        self.release_all()
        self.agent.close(timeout)
