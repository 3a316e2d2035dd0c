"""Scheduler side: decide per step which items workers stage and load.

The flow, states, bounds and options are described once, in docs/vllm.md
("Flow per engine step"). In short:

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

Items are keyed under the encoder-weights fingerprint the workers announce
(over the stage channel; without one, in their step reports); a change
gives up every prefetch. Until it is known nothing is looked up: caching is
paused, and the ``caching`` feature reads off in the stats, with why
(``caching_paused``). Each item has one state and deadline (``items.py``),
changed by ``ItemTable`` only.

Why staging: a staged load cannot fail once promised; a tier read at the
last moment could, after the encoder was skipped (vLLM's model runner raises
on the missing entry). A failed staging simply means the encoder runs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from ...claims import ClaimAgent
from ...runtime_dirs import Feature, RuntimeDirUnavailable, feature_off
from .encode_claims import CLAIM_STATES, EncodeClaims
from .features_off import OffChanges
from .identity import is_content_identifier
from .index import PENDING, TierIndex
from .items import ItemState, ItemTable
from .metadata import ECTierConnectorMetadata, ECTierWorkerMetadata
from .prefetch import PrefetchQueue
from .settings import ConnectorSettings
from .stage_client import StageClient
from .stage_messages import StageAnswer, WeightsAnnouncement, WorkerReport
from .step_wait import StepWait
from .timeline import SchedulerTimeline

logger = logging.getLogger(__name__)

S = ItemState
_FETCHING = (S.QUEUED, S.STAGING, S.READY, S.PROMISED)  # a prefetch is under way or done

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

    def persistable(self, identifier: str) -> bool:
        return self.settings.persist_non_content_ids or is_content_identifier(identifier)

    def mark_ready(self, identifiers: list[str]) -> None:
        """Treat ``identifiers`` as staged on every rank (what the workers' reports do)."""
        deadline = time.monotonic() + self.settings.stage_timeout_s
        for identifier in identifiers:
            self.items.move(identifier, S.READY, deadline)

    # -- before scheduling ---------------------------------------------------

    def _begin_step(self) -> None:
        """Once per step: read what the workers said (a weight update first of all)."""
        if self._polled:
            return
        self._polled = True
        if self._channel_ready():
            self._poll_channel(0.0)

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        if not self.is_consumer:
            return True
        self._begin_step()
        if request.request_id in self._failing:
            return False
        now = time.monotonic()
        ready = True
        for feature in request.mm_features:
            pos = feature.mm_position
            if pos.offset + pos.length <= num_computed_tokens:
                continue
            nbytes = pos.get_num_embeds() * self.bytes_per_embed
            if not self._item_ready(feature.identifier, now, nbytes, request.request_id):
                self.prefetch.wait(feature.identifier, request.request_id)
                ready = False
        if request.request_id in self._failing:  # an item of it was just given up
            ready = False
        if not ready:
            self._count("deferred_steps")
        return ready

    def _item_ready(self, identifier: str, now: float, nbytes: int, request_id: str) -> bool:
        """False while ``identifier`` is on its way into worker memory."""
        state = self.items.state(identifier)
        if state in (S.READY, S.PROMISED, S.RESIDENT):
            return True
        if self.settings.in_step_reads:
            return self._approve_at_once(identifier, now)
        if state not in (S.QUEUED, S.STAGING):
            answer = self._start_prefetch(identifier, now, nbytes, request_id)
            if answer is not None:
                return answer
        item = self.items.get(identifier)
        if item is not None and item.state is S.STAGING:
            if item.direct:
                # A waiter already: if the staging fails meanwhile, a consumer fails it.
                self.prefetch.wait(identifier, request_id)
                self._await_staging(identifier)
                if self.items.state(identifier) is not S.STAGING:
                    return True  # staged (a load), or given up (computed or failed)
            elif self._undelivered:  # an idle V1 step: the orders never reached the workers
                self._give_up(identifier, now, "idle step", fetch_failed=False)
                return True
            if now < item.deadline:
                return False
            self._give_up(identifier, now, "staging timed out")
            return True
        if now < self.prefetch.queued_deadline(identifier):
            return False
        self._give_up(identifier, now, "no room to prefetch it in time")
        return True

    def _approve_at_once(self, identifier: str, now: float) -> bool:
        """``in_step_reads``: a tier hit is approved now and read inside the step."""
        if self.weights is None or not self.persistable(identifier):
            return True
        tier = self._lookup(identifier, now)
        if tier == PENDING:  # the same existence check as with prefetch
            return now >= self.items.get(identifier).deadline
        if tier is not None:
            self.items.move(identifier, S.READY, now + self.settings.stage_timeout_s)
        return True

    def _lookup(self, identifier: str, now: float, *, fresh: bool = False) -> str | None:
        """The index's answer; PENDING (state LOOKING_UP) while the remote check runs."""
        tier = self.index.lookup(identifier, fresh=fresh)
        if tier == PENDING:
            item = self.items.get(identifier)
            if item is None or item.state is not S.LOOKING_UP:
                item = self.items.move(
                    identifier, S.LOOKING_UP, now + self.settings.remote_lookup_timeout_s
                )
        elif self.items.state(identifier) is S.LOOKING_UP:
            self.items.move(identifier, S.UNKNOWN)
        if tier != PENDING:
            self._mark(identifier, "lookup")
        return tier

    def _start_prefetch(
        self, identifier: str, now: float, nbytes: int, request_id: str
    ) -> bool | None:
        """Queue a prefetch of ``identifier`` if the tiers hold it.

        Returns the answer for ``_item_ready`` when no prefetch starts (True:
        compute it; False: wait for the remote lookup or another instance's
        encode), None once queued.
        """
        item = self.items.get(identifier)
        if item is not None and item.state is S.FAILED:
            if now < item.retry_after:
                return True
            item.retry_after = 0.0
            self.items.move(identifier, S.UNKNOWN)
            item = None
        if self.weights is None or not self.persistable(identifier):
            return True
        if item is not None and item.state in CLAIM_STATES:
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
                return now >= deadline
        if tier is None:
            return self._encode_or_wait(identifier, now, nbytes, request_id)
        return self._enqueue(identifier, now, nbytes)

    def _encode_or_wait(
        self, identifier: str, now: float, nbytes: int, request_id: str
    ) -> bool | None:
        """No tier holds ``identifier``: encode it here, or wait for the instance
        that claimed it (``encode_claims.py``) and prefetch its output."""
        answer = True if self.claims is None else self.claims.decide(identifier, now, request_id)
        return self._enqueue(identifier, now, nbytes) if answer is None else answer

    def _enqueue(self, identifier: str, now: float, nbytes: int) -> bool | None:
        if not self.prefetch.fits_at_all(nbytes):
            self._count("prefetch_too_large")
            self._fail(identifier, now)
            return True
        self.items.move(identifier, S.QUEUED, now + self.settings.stage_timeout_s)
        self.prefetch.enqueue(identifier, now + self.settings.stage_timeout_s, nbytes)
        self._count("prefetch_queued")
        self._dispatch_prefetches()
        return None

    # -- waiting for the workers ---------------------------------------------

    def _await_staging(self, identifier: str) -> None:
        """Wait for the workers' answer about ``identifier``, within this step's budget.

        With nothing else running, a wait stalls nobody (``idle_stage_wait_s``);
        otherwise it delays the running batch as a read inside the step would
        (``busy_stage_wait_s``).
        """
        started = time.monotonic()
        # Never past the staging deadline: then the item is given up as before.
        deadline = self.items.get(identifier).deadline
        step = self.step
        budget = min(step.budget(), step.waited + deadline - started)
        left = budget - step.waited
        if left <= 0:
            return  # the step's next poll reads the answer (and sends the order)
        self._poll_channel(0.0)
        while self._staging_direct(identifier) and left > 0:
            self._poll_channel(left)
            left = budget - step.waited - (time.monotonic() - started)
        step.waited += time.monotonic() - started

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
            item = self.items.move(identifier, S.STAGING, deadline)
            item.direct = direct
            if not direct:
                self._to_stage.append(identifier)
            self._mark(identifier, "stage_sent")
            self._count("stage_orders")

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
        item = self.items.move(identifier, S.FAILED, now + self.settings.failed_retry_s)
        item.retry_after = item.deadline

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

    # -- scheduling ----------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        self._count("lookups")
        self._begin_step()
        if self.is_consumer:
            item = self.items.get(identifier)
            hit = item is not None and item.state in (S.READY, S.PROMISED)
            if hit and item.state is S.READY:
                self.items.promise(identifier, item)
        else:
            # Encode-only producer: what the tiers hold need not be encoded again.
            hit = (
                self.weights is not None
                and self.persistable(identifier)
                and self.index.lookup(identifier) not in (None, PENDING)
            )
        if hit:
            self._count("lookup_hits")
        return hit

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        feature = request.mm_features[index]
        identifier = feature.identifier
        state = self.items.state(identifier)
        if self.is_consumer and state is S.PROMISED:
            self._loads[identifier] = feature.mm_position.get_num_embeds()
            self._mark(identifier, "scheduled")
            self.prefetch.done(identifier)  # consumed from the workers' staging
            self.prefetch.take_waiters(identifier)
        elif state in _FETCHING:  # computed after all: the prefetch is not wanted
            self.prefetch.done(identifier)
            self.prefetch.take_waiters(identifier)
            self._cancel_order(identifier, state)
        self.items.move(identifier, S.RESIDENT)

    def request_finished(self, request_id: str) -> None:
        self.prefetch.forget_request(request_id)
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
            if self.items.state(identifier) is S.RESIDENT:
                self.items.move(identifier, S.UNKNOWN)
        for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
            self._active.add(new.req_id)
        self.step.new_step()
        self._polled = False
        now = time.monotonic()
        for identifier in self.items.having(S.PROMISED):  # approved, then not scheduled
            self.items.move(identifier, S.READY, self.items.get(identifier).deadline)
        for identifier in self.items.having(S.READY):
            if now >= self.items.get(identifier).deadline:  # staged for a request gone
                self.items.move(identifier, S.UNKNOWN)
                self.prefetch.done(identifier)
                self.prefetch.take_waiters(identifier)
                self._to_release.append(identifier)
        self._dispatch_prefetches()
        if self.channel is not None:
            self.channel.flush()  # this step's orders, in as few writes as they fit
        meta = ECTierConnectorMetadata(loads=self._loads)
        self._loads = {}
        idle = not getattr(scheduler_output, "total_num_scheduled_tokens", 0)
        self._undelivered = idle and not self.deliver_on_idle
        if not self._undelivered:
            meta.stage, self._to_stage = self._to_stage, []
            meta.release, self._to_release = self._to_release, []
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
        for identifier in meta.failed:
            self._note_failed(identifier, now)
        for identifier, ranks in meta.staged.items():
            self._note_staged(identifier, ranks, now)
        for name, value in meta.stats.items():
            self.worker_stats[name] = self.worker_stats.get(name, 0) + value

    def _note_staged(self, identifier: str, ranks: int, now: float) -> None:
        item = self.items.get(identifier)
        if item is None or item.state is not S.STAGING:
            return  # given up meanwhile; its release is already queued
        item.ranks += ranks
        if item.ranks >= self.tp_size:
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
