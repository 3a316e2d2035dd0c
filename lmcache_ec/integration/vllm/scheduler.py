"""Scheduler side: decide per step which items workers stage and load.

The flow, states, bounds and options are described once, in docs/vllm.md
("Flow per engine step"); each item's state, and the transitions allowed,
in ``items.py``. In short:

1. ``ensure_cache_available`` defers a request (not the batch) while an item
   the tiers hold is *prefetched*: staged into every rank's memory
   (``prefetch.py`` orders it, the stage channel ``channel.py`` carries it,
   ``step_wait.py`` bounds the wait within the step). Past its deadline the
   item is computed, or, on a consumer-only instance, its requests are
   reported unavailable. On ``ec_both`` an item no tier holds is claimed
   first, so one instance encodes it (``encode_claims.py``).
2. ``has_cache_item`` is True only for items staged on every rank (for an
   encode-only producer: items the tiers hold).
3. ``update_state_after_alloc``: only items approved this step become loads.
4. ``build_connector_meta``: load/release (and, without a channel, stage) orders.
5. ``update_connector_output``: saves, staging results, worker stats.

A deferred request costs nothing per step until something it waits on
changes: the item table reports items that moved (an answer, a give-up) and
items whose deadline passed, the index the remote checks answered; only the
requests waiting on those items look at them again. Claims are the one
exception: no event says another instance's output landed, so items in a
claim state are looked at once a step.

vLLM asks ``has_cache_item`` only for an item its own encoder cache lacks: an
item recorded LOADED or RESIDENT there was dropped without a free notice
(``reset_encoder_cache`` clears vLLM's list of freed items), so its record
is stale and dropped. The reset itself also reaches ``encoder_cache_reset``
(``weight_updates.py``): every LOADED and RESIDENT record is dropped, and an item
asked for again is fetched from the tiers again.

Items are keyed under the encoder-weights fingerprint the workers announce
(over the stage channel; without one, in their step reports); a change
gives up every prefetch. Until it is known nothing is looked up: caching is
paused, and the ``caching`` feature reads off in the stats, with why
(``caching_paused``).

Why staging: a staged load cannot fail once promised; a tier read at the
last moment could, after the encoder was skipped (vLLM's model runner raises
on the missing entry). A failed staging simply means the encoder runs.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...claims import ClaimAgent
from ...runtime_dirs import Feature, RuntimeDirUnavailable, feature_off
from .connector_options import ConnectorSettings
from .encode_claims import CLAIM_STATES, EncodeClaims
from .features_off import OffChanges
from .index import PENDING, TierIndex
from .items import Item, ItemState, ItemTable
from .metadata import ECTierConnectorMetadata, ECTierWorkerMetadata
from .prefetch import PrefetchQueue
from .stage_client import StageClient
from .stage_messages import StageAnswer, WeightsAnnouncement, WorkerReport
from .step_wait import StepWait
from .timeline import SchedulerTimeline

logger = logging.getLogger(__name__)

S = ItemState
_FETCHING = (S.QUEUED, S.STAGING, S.READY, S.PROMISED)  # a prefetch is under way or done
_IN_VLLM = (S.LOADED, S.RESIDENT)  # in vLLM's encoder cache, as far as this side knows
_HELD = (S.READY, S.PROMISED, *_IN_VLLM)  # nothing to wait for

CACHING = "caching"  # the feature paused while the encoder weights are not known
# Why caching is paused: no worker has reported a fingerprint yet (or the
# last one failed); or none can: no stage channel, and Model Runner V1 drops
# an encode-only instance's step reports.
WEIGHTS_UNKNOWN = "weights_unknown"
WEIGHTS_UNREACHABLE = "weights_unreachable"
_UNREACHABLE_HELP = (
    "no stage channel reaches every worker rank, and Model Runner V1 drops an "
    "encode-only instance's worker reports, so the encoder weights fingerprint never "
    "reaches the scheduler and every item is encoded. Run every rank on the scheduler's "
    "node with a private runtime directory, or set weights_fingerprint: false and "
    "ec.weights_version"
)


class ItemAnswer(enum.Enum):
    """What one item of a request needs before the request may be scheduled."""

    HELD = "held"  # staged on every rank, or in vLLM's encoder cache
    COMPUTE = "compute"  # nothing to wait for: the encoder runs for it
    WAIT = "wait"  # on its way: the request is deferred


class ClaimDecision(enum.Enum):
    """``EncodeClaims.decide``'s answer, named."""

    ENCODE_HERE = "encode_here"  # this instance encodes it
    WAIT = "wait"  # another instance encodes it (at most claim_wait_s)
    FETCH = "fetch"  # its output landed: prefetch it

    @classmethod
    def of(cls, answer: bool | None) -> ClaimDecision:
        return cls.FETCH if answer is None else cls.ENCODE_HERE if answer else cls.WAIT


@dataclass
class _Wait:
    """A deferred request: what it needs, and what it still waits on."""

    request: Any  # vLLM's Request: one object per request, across steps
    needed: dict[str, int]  # identifier -> estimated bytes, of items still to compute
    pending: set[str] = field(default_factory=set)  # answered WAIT
    direct: set[str] = field(default_factory=set)  # pending, staging over the stage channel
    changed: set[str] = field(default_factory=set)  # moved (or due) since last looked at


class TierScheduler:
    def __init__(
        self,
        settings: ConnectorSettings,
        index: TierIndex,
        *,
        is_producer: bool,
        is_consumer: bool,
        tp_size: int,
        deliver_on_idle: bool,
        bytes_per_embed: int = 0,
        channel: StageClient | None = None,
        weights_from_workers: bool = False,
        claims: ClaimAgent | None = None,
    ) -> None:
        self.settings = settings
        self.index = index
        self.is_producer = is_producer
        self.is_consumer = is_consumer
        self.tp_size = max(1, tp_size)
        # The V1 model runner skips connector hooks in steps with no tokens.
        self.deliver_on_idle = deliver_on_idle
        # Encoder outputs are [num_embeds, hidden]: an estimate for the byte bound.
        self.bytes_per_embed = bytes_per_embed
        self.prefetch = PrefetchQueue(
            max_items=settings.max_inflight_items,
            max_bytes=int(settings.max_staged_mb * 1024 * 1024),
        )
        self.items = ItemTable()  # every item's state: see items.py
        self._active: set[str] = set()  # requests scheduled and not finished
        self.step = StepWait(
            settings.idle_stage_wait_s, settings.busy_stage_wait_s, lambda: bool(self._active)
        )
        # Given by the connector on ec_both with claim_encodes only (see encode_claims.py).
        self.claims = (
            EncodeClaims(claims, self.items, index, settings, self.step, self._count)
            if claims is not None
            else None
        )
        self._unavailable: set[str] = set()  # request ids for take_unavailable_requests
        self._failing: set[str] = set()  # reported unavailable, held until vLLM fails them
        self._waiting: dict[str, _Wait] = {}  # deferred requests by id
        self._needed_by: dict[str, set[str]] = {}  # identifier -> deferred requests needing it
        self._woken: set[str] = set()  # items due or answered, not moved: looked at again
        self._mm_end: dict[str, int] = {}  # request id -> token after its last item
        # Orders of this step, handed out by build_connector_meta.
        self._to_stage: list[str] = []
        self._to_release: list[str] = []
        self._loads: dict[str, int] = {}
        self._undelivered = False  # last step's orders never reached workers
        self.channel = channel
        self._polled = False  # the channel was read this step
        self._base_identity = index.identity
        # The weights version keys use; None until the workers announce one.
        self.weights_from_workers = weights_from_workers
        self.weights: str | None = None if weights_from_workers else index.identity.weights
        self.stats: dict[str, float] = {}
        self.worker_stats: dict[str, float] = {}
        self._off: dict[str, str] = {}  # features off on this side: name -> reason
        self._off_changes = OffChanges()
        self._unreachable_told = False
        self.timeline: SchedulerTimeline | None = None  # ec.timeline_path

    def _mark(self, identifier: str, event: str) -> None:
        if self.timeline is not None:
            self.timeline.item(identifier, event)

    def _count(self, name: str, amount: float = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + amount

    def channel_unavailable(self, error: RuntimeDirUnavailable, consequence: str) -> None:
        """No stage channel: no private directory for its sockets (one warning)."""
        self.channel = None
        self._off[Feature.STAGE_CHANNEL.value] = error.reason.value
        feature_off(Feature.STAGE_CHANNEL, error, consequence)
        self._tell_if_unreachable()

    def _tell_if_unreachable(self) -> None:
        """One warning when the fingerprint can never reach this side."""
        if self.caching_paused() == WEIGHTS_UNREACHABLE and not self._unreachable_told:
            self._unreachable_told = True
            logger.warning("Caching paused: %s", _UNREACHABLE_HELP)

    def _reports_arrive(self) -> bool:
        """Whether the workers' reports, and the fingerprint in them, reach this side."""
        connected = self.channel is not None and self.channel.connected
        # V1 drops an encode-only instance's step reports (the V2 runner does not).
        return connected or self.deliver_on_idle or self.is_consumer

    def caching_paused(self) -> str | None:
        """Why nothing is looked up now (``WEIGHTS_*``), or None."""
        if self.weights is not None:
            return None
        return WEIGHTS_UNKNOWN if self._reports_arrive() else WEIGHTS_UNREACHABLE

    def mark_ready(self, identifiers: list[str]) -> None:
        """Treat unknown ``identifiers`` as staged on every rank (what the workers' reports do)."""
        deadline = time.monotonic() + self.settings.stage_timeout_s
        for identifier in identifiers:
            if self.items.state(identifier) is S.UNKNOWN:
                self.items.move(identifier, S.READY, deadline)

    def encoder_cache_reset(self) -> None:
        """vLLM emptied its encoder cache (``Scheduler.reset_encoder_cache``, see
        ``weight_updates.py``) without listing what it freed: fetch those items again."""
        for identifier in self.items.having(*_IN_VLLM):
            self.items.move(identifier, S.UNKNOWN)
        self._count("encoder_cache_resets")

    # -- before scheduling: which requests wait ------------------------------

    def _begin_step(self) -> None:
        """Read what the workers said, once a step (a weight update first of all); note
        the items whose deadline passed or whose remote check ended."""
        if not self._polled:
            self._polled = True
            if self._channel_ready():
                self._poll_channel(0.0)
            # No event says another instance's output landed: claims are looked at each step.
            self._woken.update(self.items.having(S.CLAIMING, S.AWAITING))
        self._expire_due(time.monotonic())
        for identifier in self.index.take_answered():
            if self.items.state(identifier) is S.LOOKING_UP:
                self._woken.add(identifier)

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        if not self.is_consumer:
            return True
        self._begin_step()
        request_id = request.request_id
        if request_id in self._failing:
            return False
        wait = self._waiting.get(request_id)
        if wait is not None and wait.request is not request:  # an id used again
            self._forget_wait(request_id)
            self._mm_end.pop(request_id, None)
            wait = None
        if wait is None:
            needed = self._still_needed(request, num_computed_tokens)
            if not needed:
                return True
            wait = self._waiting[request_id] = _Wait(request, needed)
            for identifier in needed:
                self._needed_by.setdefault(identifier, set()).add(request_id)
            self._look(wait, request_id, needed)
        self._settle(wait, request_id)
        if request_id in self._failing:  # an item of it was just given up
            return False
        if wait.pending:
            self._count("deferred_steps")
            return False
        self._forget_wait(request_id)
        return True

    def _still_needed(self, request: Any, num_computed_tokens: int) -> dict[str, int]:
        """The request's items not computed yet, with their estimated bytes."""
        request_id = request.request_id
        end = self._mm_end.get(request_id)
        if end is None:
            end = max(
                (f.mm_position.offset + f.mm_position.length for f in request.mm_features),
                default=0,
            )
            self._mm_end[request_id] = end
        if num_computed_tokens >= end:
            return {}
        needed = {}
        for feature in request.mm_features:
            pos = feature.mm_position
            if pos.offset + pos.length > num_computed_tokens:
                needed[feature.identifier] = pos.get_num_embeds() * self.bytes_per_embed
        return needed

    def _settle(self, wait: _Wait, request_id: str) -> None:
        """Look again at what moved for this request; wait within the step's budget
        while it waits on stagings over the stage channel."""
        while True:
            self._wake()
            if wait.changed:
                changed, wait.changed = wait.changed, set()
                self._look(wait, request_id, changed)
            elif not (wait.direct and self._await_answers(wait)):
                return

    def _look(self, wait: _Wait, request_id: str, identifiers: Iterable[str]) -> None:
        """Decide each of ``identifiers`` for the request, then order what can start."""
        now = time.monotonic()
        # The record each decision left: every write makes a new one, so a record
        # still identical after the dispatch below was moved by nothing else.
        decided: dict[str, Item | None] = {}
        for identifier in identifiers:
            answer = self._item_ready(identifier, now, wait.needed[identifier], request_id)
            decided[identifier] = self.items.get(identifier)
            if answer is ItemAnswer.WAIT:
                wait.pending.add(identifier)
                self.prefetch.wait(identifier, request_id)
                if self._staging_direct(identifier):
                    wait.direct.add(identifier)
                else:
                    wait.direct.discard(identifier)
            else:
                wait.pending.discard(identifier)
                wait.direct.discard(identifier)
        self._dispatch_prefetches()
        self._wake()
        for identifier, record in decided.items():  # moved by its own decision: not news
            if self.items.get(identifier) is record:
                wait.changed.discard(identifier)

    def _wake(self) -> None:
        """Hand each item moved (or woken) since the last call to the requests needing it."""
        changed = self.items.take_changed()
        if self._woken:
            changed |= self._woken
            self._woken = set()
        for identifier in changed:
            for request_id in self._needed_by.get(identifier, ()):
                self._waiting[request_id].changed.add(identifier)

    def _forget_wait(self, request_id: str) -> None:
        wait = self._waiting.pop(request_id, None)
        if wait is None:
            return
        for identifier in wait.needed:
            waiting = self._needed_by.get(identifier)
            if waiting is not None:
                waiting.discard(request_id)
                if not waiting:
                    del self._needed_by[identifier]

    # -- one item's decision --------------------------------------------------

    def _item_ready(self, identifier: str, now: float, nbytes: int, request_id: str) -> ItemAnswer:
        state = self.items.state(identifier)
        if state in _HELD:
            return ItemAnswer.HELD
        if self.settings.in_step_reads:
            return self._approve_at_once(identifier, now)
        if state is S.QUEUED:
            if now < self.items.get(identifier).deadline:
                return ItemAnswer.WAIT
            self._give_up(identifier, now, "no room to prefetch it in time")
            return ItemAnswer.COMPUTE
        if state is S.STAGING:
            item = self.items.get(identifier)
            if not item.direct and self._undelivered:
                # An idle V1 step: the orders never reached the workers.
                self._give_up(identifier, now, "idle step", fetch_failed=False)
                return ItemAnswer.COMPUTE
            if now < item.deadline:
                return ItemAnswer.WAIT
            self._give_up(identifier, now, "staging timed out")
            return ItemAnswer.COMPUTE
        return self._start_prefetch(identifier, now, nbytes, request_id)

    def _approve_at_once(self, identifier: str, now: float) -> ItemAnswer:
        """``in_step_reads``: a tier hit is approved now and read inside the step."""
        if self.weights is None or not self.settings.persistable(identifier):
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
            self._mark(identifier, "lookup")
        return tier

    def _start_prefetch(
        self, identifier: str, now: float, nbytes: int, request_id: str
    ) -> ItemAnswer:
        """Queue a prefetch of ``identifier`` if the tiers hold it (WAIT once queued)."""
        if now < self.items.retry_at(identifier):
            return ItemAnswer.COMPUTE  # a fetch of it failed a moment ago
        self.items.allow_retry(identifier)
        if self.weights is None or not self.settings.persistable(identifier):
            return ItemAnswer.COMPUTE
        if self.items.state(identifier) in CLAIM_STATES:
            return self._encode_or_wait(identifier, now, nbytes, request_id)
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
            return self._encode_or_wait(identifier, now, nbytes, request_id)
        return self._enqueue(identifier, now, nbytes)

    def _encode_or_wait(
        self, identifier: str, now: float, nbytes: int, request_id: str
    ) -> ItemAnswer:
        """No tier holds ``identifier``: encode it here, or wait for the instance
        that claimed it (``encode_claims.py``) and prefetch its output."""
        if self.claims is None:
            return ItemAnswer.COMPUTE
        decision = ClaimDecision.of(self.claims.decide(identifier, now, request_id))
        if decision is ClaimDecision.FETCH:
            return self._enqueue(identifier, now, nbytes)
        return ItemAnswer.COMPUTE if decision is ClaimDecision.ENCODE_HERE else ItemAnswer.WAIT

    def _enqueue(self, identifier: str, now: float, nbytes: int) -> ItemAnswer:
        if not self.prefetch.fits_at_all(nbytes):
            self._count("prefetch_too_large")
            self._fail(identifier, now)
            return ItemAnswer.COMPUTE
        deadline = now + self.settings.stage_timeout_s
        self.items.move(identifier, S.QUEUED, deadline)
        self.prefetch.enqueue(identifier, deadline, nbytes)
        self._count("prefetch_queued")
        return ItemAnswer.WAIT

    # -- waiting for the workers ---------------------------------------------

    def _await_answers(self, wait: _Wait) -> bool:
        """Wait for the workers' answers about ``wait``'s stagings, within this step's
        budget and never past their deadline; False if no time was left.

        With nothing else running, a wait stalls nobody (``idle_stage_wait_s``);
        otherwise it delays the running batch as a read inside the step would
        (``busy_stage_wait_s``).
        """
        budget = self.step.left()
        if budget <= 0:
            return False  # the step's next poll reads the answer (and sends the order)
        started = time.monotonic()
        soonest = min(self.items.get(identifier).deadline for identifier in wait.direct)
        budget = min(budget, soonest - started)
        if budget <= 0:
            return False  # past a deadline: given up when next looked at
        left = budget
        self._poll_channel(0.0)
        while left > 0:
            self._wake()
            if wait.changed:
                break
            self._poll_channel(left)
            left = budget - (time.monotonic() - started)
        self.step.waited += time.monotonic() - started
        return True

    def _staging_direct(self, identifier: str) -> bool:
        item = self.items.get(identifier)
        return item is not None and item.state is S.STAGING and item.direct

    def _dispatch_prefetches(self) -> None:
        dispatched = [identifier for identifier, _ in self.prefetch.dispatch()]
        if not dispatched:
            return
        deadline = time.monotonic() + self.settings.stage_timeout_s
        direct = self._channel_ready() and self.channel.send(dispatched, self.weights or "")
        for identifier in dispatched:
            self.items.stage(identifier, deadline, direct=direct)
            if not direct:
                self._to_stage.append(identifier)
            self._mark(identifier, "stage_sent")
        self._count("stage_orders", len(dispatched))

    def _channel_ready(self) -> bool:
        """True if stage orders can go over the channel now."""
        if self.channel is None:
            return False
        if self.channel.connected:
            return True
        if not self.channel.reconnect():
            return False
        logger.info("Stage orders go over the stage channel")
        # Workers announce their weights on connect; take it before deciding
        # anything, within what is left of this step's budget.
        self.step.wait(self._poll_channel, self.settings.idle_stage_wait_s)
        return True

    def _poll_channel(self, timeout: float) -> None:
        """Apply what the workers said (waiting up to ``timeout`` for the first message)."""
        if self.channel is None:
            return
        now = time.monotonic()
        for message in self.channel.receive(timeout):
            match message:
                case WorkerReport():
                    report = ECTierWorkerMetadata.from_report(message)
                    self.update_connector_output(report, over_channel=True)
                case WeightsAnnouncement(weights=weights):
                    self._set_weights(weights, now)
                case StageAnswer(weights=weights) if weights == self.weights:
                    for identifier in message.staged:
                        self._note_staged(identifier, 1, now)
                    for identifier in message.failed:
                        self._note_failed(identifier, now)
                case StageAnswer():
                    pass  # ordered under weights since replaced
        if not self.channel.connected:  # broke: nothing more will answer these
            for identifier in self.items.having(S.STAGING):
                if self._staging_direct(identifier):
                    self._give_up(identifier, now, "the stage channel broke")

    def _set_weights(self, weights: str | None, now: float) -> None:
        """The workers' encoder weights are now ``weights`` (None: unknown)."""
        if weights == self.weights:
            return
        logger.info("Encoder weights %s -> %s", self.weights, weights)
        self.weights = weights
        self.index.set_identity(dataclasses.replace(self._base_identity, weights=weights or ""))
        doomed = self.items.having(*_FETCHING)
        for identifier in doomed:
            self._give_up(identifier, now, "the encoder weights changed", fetch_failed=False)
        # Failures, lookups and claims under the old weights say nothing now.
        self.items.forget_retries()
        if self.claims is not None:
            self.claims.release_all()
        for identifier in self.items.having(S.LOOKING_UP, *CLAIM_STATES):
            self.items.move(identifier, S.UNKNOWN)
        self._count("weights_changes")

    def _fail(self, identifier: str, now: float) -> None:
        """Compute ``identifier`` and fetch it again at the earliest after ``failed_retry_s``."""
        self.items.fail(identifier, now + self.settings.failed_retry_s)

    def _give_up(self, identifier: str, now: float, why: str, *, fetch_failed: bool = True) -> None:
        """Stop waiting for ``identifier``: compute it, or fail its requests on a consumer."""
        state = self.items.state(identifier)
        waiters = self.prefetch.take_waiters(identifier)
        if fetch_failed and not self.is_producer and waiters:
            logger.warning(
                "Encoder output %.24s could not be fetched (%s); %d request(s) fail",
                identifier,
                why,
                len(waiters),
            )
            self._unavailable |= waiters
            self._failing |= waiters
            self._count("unavailable_requests", len(waiters))
            self.items.move(identifier, S.UNKNOWN)
        else:
            logger.info("Encoder output %.24s will be computed: %s", identifier, why)
            self._fail(identifier, now)
        self.prefetch.done(identifier)
        self.index.forget(identifier)  # the next request looks again
        self._cancel_order(identifier, state)
        self._count("stage_given_up")

    def _cancel_order(self, identifier: str, state: ItemState) -> None:
        """Take back the stage order of an item that was in ``state``."""
        if state is S.QUEUED:
            pass  # never ordered
        elif identifier in self._to_stage:
            self._to_stage.remove(identifier)  # never reached the workers
        elif state in (S.STAGING, S.READY, S.PROMISED):
            self._to_release.append(identifier)

    def _release_unused(self, identifier: str) -> None:
        """A staged item's deadline passed unused (its request is gone): free its memory."""
        self.items.move(identifier, S.UNKNOWN)
        self.prefetch.done(identifier)
        self.prefetch.take_waiters(identifier)
        self._to_release.append(identifier)

    def _expire_due(self, now: float) -> None:
        """Items whose deadline passed: staged ones unused are released, the rest
        looked at again by the requests waiting on them."""
        for identifier in self.items.take_due(now):
            if self.items.state(identifier) is S.READY:
                self._release_unused(identifier)
            else:
                self._woken.add(identifier)

    # -- scheduling ----------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        self._count("lookups")
        self._begin_step()
        state = self.items.state(identifier)
        if state in _IN_VLLM:
            self._drop_stale(identifier)
            state = S.UNKNOWN
        if self.is_consumer:
            if state is S.READY:
                self.items.promise(identifier)
            hit = state in (S.READY, S.PROMISED)
        else:
            # Encode-only producer: what the tiers hold need not be encoded again.
            hit = (
                self.weights is not None
                and self.settings.persistable(identifier)
                and self.index.lookup(identifier) not in (None, PENDING)
            )
        if hit:
            self._count("lookup_hits")
        return hit

    def _drop_stale(self, identifier: str) -> None:
        """vLLM asks about an item recorded in its encoder cache: it is no longer there."""
        self.items.move(identifier, S.UNKNOWN)
        self._count("stale_items")

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        feature = request.mm_features[index]
        identifier = feature.identifier
        state = self.items.state(identifier)
        if self.is_consumer and state is S.PROMISED:
            self._loads[identifier] = feature.mm_position.get_num_embeds()
            self._mark(identifier, "scheduled")
            self.prefetch.done(identifier)  # consumed from the workers' staging
            self.prefetch.take_waiters(identifier)
            self.items.move(identifier, S.LOADED)
            return
        if state in _IN_VLLM:
            self._drop_stale(identifier)
        elif state in _FETCHING:  # computed after all: the prefetch is not wanted
            self.prefetch.done(identifier)
            self.prefetch.take_waiters(identifier)
            self._cancel_order(identifier, state)
        self.items.move(identifier, S.RESIDENT)

    def request_finished(self, request_id: str) -> None:
        self.prefetch.forget_request(request_id)
        self._forget_wait(request_id)
        self._mm_end.pop(request_id, None)
        self._active.discard(request_id)
        self._failing.discard(request_id)
        if self.claims is not None:  # claimed and never computed: others need not wait
            self.claims.release_for(request_id)

    def take_unavailable_requests(self) -> set[str]:
        unavailable, self._unavailable = self._unavailable, set()
        return unavailable

    def build_connector_meta(self, scheduler_output: Any) -> ECTierConnectorMetadata:
        if self._channel_ready():  # worker reports of the last step
            self._poll_channel(0.0)
        for identifier in getattr(scheduler_output, "free_encoder_mm_hashes", None) or ():
            if self.items.state(identifier) in _IN_VLLM:
                self.items.move(identifier, S.UNKNOWN)
        for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
            self._active.add(new.req_id)
        self.step.new_step()
        self._polled = False
        now = time.monotonic()
        for identifier in self.items.having(S.PROMISED):  # approved, then not scheduled
            deadline = self.items.get(identifier).deadline
            if now >= deadline:
                self._release_unused(identifier)
            else:
                self.items.move(identifier, S.READY, deadline)
        self._expire_due(now)
        self._dispatch_prefetches()
        if self.channel is not None:
            self.channel.flush()  # this step's orders, in as few writes as they fit
        meta = ECTierConnectorMetadata(loads=self._loads)
        self._loads = {}
        idle = not getattr(scheduler_output, "total_num_scheduled_tokens", 0)
        self._undelivered = idle and not self.deliver_on_idle
        if self._undelivered:  # their requests give up what they ordered in step metadata
            for identifier in self.items.having(S.STAGING):
                if not self.items.get(identifier).direct:
                    self._woken.add(identifier)
        else:
            meta.stage, self._to_stage = self._to_stage, []
            meta.release, self._to_release = self._to_release, []
        if not self._waiting:  # nobody to wake: what moved concerns no request
            self.items.take_changed()
            self._woken.clear()
        return meta

    # -- after the step ------------------------------------------------------

    def update_connector_output(
        self, meta: ECTierWorkerMetadata | None, *, over_channel: bool = False
    ) -> None:
        """Apply the workers' report (from step metadata, or ``over_channel``)."""
        if meta is None:
            return
        now = time.monotonic()
        if self.weights_from_workers and not over_channel and not self._channel_connected():
            # No stage channel: the fingerprint comes with the step reports.
            self._set_weights(meta.weights, now)
        if meta.weights is not None and meta.weights == self.weights:
            for identifier in meta.saved:
                self.index.note_present(identifier, "worker")
                if self.claims is not None:
                    self.claims.release(identifier)  # others load it now
        if meta.weights == self.weights:  # stagings answered under other weights move nothing
            for identifier in meta.failed:
                self._note_failed(identifier, now)
            for identifier, ranks in meta.staged.items():
                self._note_staged(identifier, ranks, now)
        for name, value in meta.stats.items():
            self.worker_stats[name] = self.worker_stats.get(name, 0) + value

    def _note_staged(self, identifier: str, ranks: int, now: float) -> None:
        if self.items.state(identifier) is not S.STAGING:
            return  # given up meanwhile; its release is already queued
        if self.items.add_ranks(identifier, ranks) >= self.tp_size:
            self.items.move(identifier, S.READY, now + self.settings.stage_timeout_s)
            self._mark(identifier, "staged")

    def _note_failed(self, identifier: str, now: float) -> None:
        self.index.forget(identifier)
        if self.items.state(identifier) in (S.STAGING, S.READY, S.PROMISED):
            self._give_up(identifier, now, "a worker could not fetch it")

    def _channel_connected(self) -> bool:
        return self.channel is not None and self.channel.connected

    def take_stats(self) -> dict[str, float]:
        """Scheduler and worker counters since the last call, then reset; with
        the changes of the features off on this side (``features_off.OffChanges``).

        vLLM asks right after each step; the workers' reports of that step are
        already on the stage channel.
        """
        if self.channel is not None:
            if self._channel_connected():
                self._poll_channel(0.0)
            for name, value in self.channel.take_counts().items():
                self._count(name, value)
        merged = {f"scheduler_{k}": v for k, v in self.stats.items()}
        merged.update(self.worker_stats)
        self.stats, self.worker_stats = {}, {}
        off = dict(self._off)
        paused = self.caching_paused()
        if paused is not None:
            off[CACHING] = paused
        self._tell_if_unreachable()
        for name, change in self._off_changes.take(off).items():
            merged[name] = merged.get(name, 0) + change  # a worker's may share the name
        return merged

    def close(self) -> None:
        """Withdraw claims still held (their outputs will not land from here)."""
        if self.claims is not None:
            self.claims.close()
