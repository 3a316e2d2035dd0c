"""Scheduler side: decide per step which items workers stage and load.

The flow, states, bounds and options: docs/vllm.md ("Flow per engine step":
what each hook below does); item states and transitions: ``items.py``; an
item's answer for a request: ``item_decisions.py``. Prefetches are ordered by
``prefetch.py``, carried by the stage channel (``channel.py``), waited for
within a step's budget (``step_wait.py``); claims: ``encode_claims.py``.

A deferred request costs nothing per step until something it waits on
changes (``request_waits.py`` keeps the books and says how). Orders reach the
workers, and their answers come back, through ``worker_link.py``.

vLLM asks ``has_cache_item`` only for an item its encoder cache lacks: one
recorded LOADED or RESIDENT there was dropped without a free notice (its
``reset_encoder_cache``, also seen by ``weight_updates.py``): the stale record
is dropped and the item fetched from the tiers again.

Items are keyed under the encoder-weights fingerprint the workers announce
(``known_weights.py``); a change gives up every prefetch. Until it is known
nothing is looked up: caching is paused, and reads off in the stats.
Why staging: see ``worker_link.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from ...claims import ClaimAgent
from ...runtime_dirs import RuntimeDirUnavailable
from .connector_options import ConnectorSettings
from .encode_claims import CLAIM_STATES, EncodeClaims
from .index import PENDING, TierIndex
from .item_decisions import ItemDecisions
from .items import ASKED_ABOUT, FETCHING, IN_VLLM, Item, ItemAnswer, ItemState, ItemTable
from .known_weights import KnownWeights
from .metadata import ECTierConnectorMetadata, ECTierWorkerMetadata
from .prefetch import PrefetchQueue
from .request_waits import RequestWaits, Wait
from .stage_client import StageClient
from .step_wait import StepWait
from .timeline import SchedulerTimeline
from .worker_link import WorkerLink

logger = logging.getLogger(__name__)

S = ItemState


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
        # The V1 model runner skips connector hooks in steps with no tokens.
        self.deliver_on_idle = deliver_on_idle
        self.prefetch = PrefetchQueue(
            max_items=settings.max_inflight_items,
            max_bytes=int(settings.max_staged_mb * 1024 * 1024),
        )
        self.items = ItemTable()  # every item's state: see items.py
        self._active: set[str] = set()  # requests scheduled and not finished
        # Requests this step let through (``ensure_cache_available``): vLLM is
        # scheduling them now, so a later request's wait would delay their step.
        self._passed: set[str] = set()
        # Request id -> the items it still needed when first let through. vLLM asks
        # about a running request's items at every step of its prefill; it waits
        # on none of these again (only on items a later chunk of input adds).
        self._passed_with: dict[str, frozenset[str]] = {}
        self.step = StepWait(
            settings.idle_stage_wait_s,
            settings.busy_stage_wait_s,
            lambda: bool(self._active or self._passed),
        )
        # Given by the connector on ec_both with claim_encodes only (see encode_claims.py).
        self.claims = (
            EncodeClaims(claims, self.items, index, settings, self.step, self.count)
            if claims is not None
            else None
        )
        self.link = WorkerLink(
            self,
            channel,
            settings,
            self.items,
            self.prefetch,
            index,
            self.step,
            tp_size=max(1, tp_size),
            claims=self.claims,
            weights_from_reports=weights_from_workers,
        )
        self.waits = RequestWaits(
            self.items, self.step, bytes_per_embed, self._look, self.link.poll
        )
        self._loads: dict[str, int] = {}  # this step's loads, handed out by build_connector_meta
        # Loads handed out last step: their room in flight is free once that step
        # ran (its load takes the worker's copy). Freed when scheduled, an order
        # of the same step would find the worker's memory still full and fail.
        self._loads_running: list[str] = []
        # Stagings ordered in step metadata when an idle step kept it from the
        # workers (V1 without a channel): their requests give them up. An order
        # made since waits for the step it was made in.
        self._held_back: set[str] = set()
        self.decisions = ItemDecisions(
            self,
            settings,
            self.items,
            index,
            self.prefetch,
            self.step,
            self.claims,
            held_back=self._held_back,
        )
        self._polled = False  # the channel was read this step
        self.known = KnownWeights(
            index, from_workers=weights_from_workers, reports_arrive=self._reports_arrive
        )
        self.stats: dict[str, float] = {}
        self.timeline: SchedulerTimeline | None = None  # ec.timeline_path

    def mark(self, identifier: str, event: str) -> None:
        if self.timeline is not None:
            self.timeline.item(identifier, event)

    def count(self, name: str, amount: float = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + amount

    @property
    def channel(self) -> StageClient | None:
        """The stage channel to the workers (None: orders go in step metadata)."""
        return self.link.channel

    def channel_unavailable(self, error: RuntimeDirUnavailable, consequence: str) -> None:
        """No stage channel: no private directory for its sockets (one warning)."""
        self.link.channel = None
        self.known.channel_unavailable(error, consequence)

    @property
    def weights(self) -> str | None:
        """The encoder weights items are keyed under; None until the workers announce them."""
        return self.known.current

    def _reports_arrive(self) -> bool:
        """Whether the workers' reports, and the fingerprint in them, reach this side."""
        # V1 drops an encode-only instance's step reports (the V2 runner does not).
        return self.link.connected or self.deliver_on_idle or self.is_consumer

    def mark_ready(self, identifiers: list[str]) -> None:
        """Treat unknown ``identifiers`` as staged on every rank (what the workers' reports do)."""
        deadline = time.monotonic() + self.settings.stage_timeout_s
        for identifier in identifiers:
            if self.items.state(identifier) is S.UNKNOWN:
                self.items.move(identifier, S.READY, deadline)

    def encoder_cache_reset(self) -> None:
        """vLLM emptied its encoder cache (``Scheduler.reset_encoder_cache``, see
        ``weight_updates.py``) without listing what it freed: fetch those items again.

        Staged items are given up too: a reset is how vLLM drops outputs of weights
        being replaced, and the workers' change reaches this side a report later
        without a stage channel, after a promise of one would load the old output.
        """
        for identifier in self.items.having(*IN_VLLM):
            self.items.move(identifier, S.UNKNOWN)
        now = time.monotonic()
        for identifier in self.items.having(S.READY, S.PROMISED):
            self.give_up(identifier, now, "vLLM reset its encoder cache", fetch_failed=False)
        self.count("encoder_cache_resets")

    # -- before scheduling: which requests wait ------------------------------

    def _begin_step(self) -> None:
        """Read what the workers said, once a step (a weight update first of all); note
        the items whose deadline passed or whose remote check ended."""
        if not self._polled:
            self._polled = True
            self._free_loads_run()
            if self.link.channel_ready():
                self.link.poll(0.0)
            # No event says another instance's output landed: claims are looked at each step.
            self.waits.wake_later(self.items.having(S.CLAIMING, S.AWAITING))
        self._expire_due(time.monotonic())
        for identifier in self.index.take_answered():
            if self.items.state(identifier) is S.LOOKING_UP:
                self._look_again_if_needed(identifier)

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        if not self.is_consumer:
            return True
        self._begin_step()
        request_id = request.request_id
        if self.waits.failing(request_id):
            return False
        wait = self.waits.find(request)
        if wait is None:
            needed = self.waits.still_needed(request, num_computed_tokens)
            if not needed:
                self._let_through(request_id, ())
                return True
            wait = self.waits.start(request, needed)
            self._look(wait, needed)
        self.waits.settle(wait)
        if self.waits.failing(request_id):  # an item of it was just given up
            return False
        if wait.pending:
            self.count("deferred_steps")
            return False
        self.waits.forget(request_id)
        self._let_through(request_id, wait.needed)
        return True

    def _let_through(self, request_id: str, needed: Iterable[str]) -> None:
        self._passed.add(request_id)
        if request_id not in self._passed_with:
            self._passed_with[request_id] = frozenset(needed)

    def _look(self, wait: Wait, identifiers: Iterable[str]) -> None:
        """Decide each of ``identifiers`` for the request, then order what can start."""
        now = time.monotonic()
        request_id = wait.request_id
        identifiers = list(identifiers)
        others = wait.pending.difference(identifiers)
        room = self.prefetch.room([wait.needed[other] for other in others])
        # A request let through before waits again on none of the items it had then:
        # deferred, it would hold staged copies of its later items (room in flight)
        # while waiting for room only they free. What no one holds is computed.
        passed_with = self._passed_with.get(request_id, frozenset())
        # The record each decision left: every write makes a new one, so a record
        # still identical after the dispatch below was moved by nothing else.
        decided: dict[str, Item | None] = {}
        for identifier in identifiers:
            if identifier in wait.computed:
                wait.record(identifier, waits=False, direct=False)
                continue
            nbytes = wait.needed[identifier]
            rows = wait.rows.get(identifier, 0)
            answer = self.decisions.decide(
                identifier,
                now,
                nbytes,
                request_id,
                room,
                rows,
                may_wait=identifier not in passed_with,
            )
            decided[identifier] = self.items.get(identifier)
            waits = answer is ItemAnswer.WAIT
            if waits:
                self.prefetch.wait(identifier, request_id)
                room.take(nbytes)
            wait.record(identifier, waits=waits, direct=self.link.staging_direct(identifier))
        self.link.dispatch()
        self.waits.wake()
        for identifier, record in decided.items():  # moved by its own decision: not news
            if self.items.get(identifier) is record:
                wait.changed.discard(identifier)

    def set_weights(self, weights: str | None, now: float) -> None:
        """The workers' encoder weights are now ``weights`` (None: unknown): every
        fetch, lookup and claim made under the old ones is given up."""
        if not self.known.change(weights):
            return
        doomed = self.items.having(*FETCHING)
        for identifier in doomed:
            self.give_up(identifier, now, "the encoder weights changed", fetch_failed=False)
        # Failures, lookups and claims under the old weights say nothing now.
        self.items.forget_retries()
        if self.claims is not None:
            self.claims.release_all()
        for identifier in self.items.having(S.LOOKING_UP, *CLAIM_STATES):
            self.items.move(identifier, S.UNKNOWN)
        self.count("weights_changes")

    def reject(self, request_id: str, identifier: str, rows: int, queued_rows: int) -> None:
        """``request_id`` has ``rows`` placeholders for ``identifier``, which is
        being fetched for ``queued_rows``: it fails, as vLLM fails a request whose
        item its encoder cache holds with other rows (a client UUID reused)."""
        logger.warning(
            "Request %s expects %d embeddings of %.24s, fetched for %d: a client-provided "
            "multimodal UUID may have been reused for different content; the request fails",
            *(request_id, rows, identifier, queued_rows),
        )
        self.waits.fail({request_id})
        self.count("rows_mismatch_requests")

    def fail(self, identifier: str, now: float) -> None:
        """Compute ``identifier`` and fetch it again at the earliest after ``failed_retry_s``."""
        self.items.fail(identifier, now + self.settings.failed_retry_s)

    def give_up(
        self,
        identifier: str,
        now: float,
        why: str,
        *,
        fetch_failed: bool = True,
        waiters_compute: bool = False,
    ) -> None:
        """Stop waiting for ``identifier``: compute it, or fail its requests on a consumer.

        Only a fetch that failed (``fetch_failed``) holds the item off the tiers for
        ``failed_retry_s``; an order an idle step dropped, or a weights change, does not:
        its requests fetch it again, unless ``waiters_compute`` (no room came in time).
        """
        state = self.items.state(identifier)
        waiters = self.prefetch.take_waiters(identifier)
        if fetch_failed and not self.is_producer and waiters:
            logger.warning(
                "Encoder output %.24s could not be fetched (%s); %d request(s) fail",
                identifier,
                why,
                len(waiters),
            )
            self.waits.fail(waiters)
            self.count("unavailable_requests", len(waiters))
            self.items.move(identifier, S.UNKNOWN)
        else:
            logger.info("Encoder output %.24s will be computed: %s", identifier, why)
            if waiters_compute:
                self.waits.compute(identifier, waiters)
            if fetch_failed and self.is_producer:
                self.fail(identifier, now)
            else:  # nothing failed, or a consumer: the next request fetches it again
                self.items.move(identifier, S.UNKNOWN)
        self.prefetch.done(identifier)
        self._held_back.discard(identifier)
        self.index.forget(identifier)  # the next request looks again
        self.link.cancel(identifier, state)
        self.count("stage_given_up")

    def _expire_due(self, now: float) -> None:
        """Items whose deadline passed: staged ones unused are released, the rest
        looked at again by the requests waiting on them; a prefetch no request
        waits for any more is given up (its slot in flight comes back), and so is
        the record of a lookup or claim no request waits for (``_look_again_if_needed``)."""
        for identifier in self.items.take_due(now):
            state = self.items.state(identifier)
            if state is S.READY:
                self._staged_past_deadline(identifier, now)
            elif state in (S.QUEUED, S.STAGING) and not self.prefetch.waited_on(identifier):
                self._give_up_unwanted(identifier, state, now)
            elif state is S.FAILED:  # its retry time: the record says nothing any more
                self.items.allow_retry(identifier)
            elif state in ASKED_ABOUT:
                self._look_again_if_needed(identifier)
            else:
                self.waits.wake_later((identifier,))

    def _staged_past_deadline(self, identifier: str, now: float) -> None:
        """A staged item's deadline passed unused: its copy is released, unless a
        deferred request still waits on it (for its other items). Released then,
        it would be queued again behind other requests' prefetches, and requests
        holding staged items while waiting for room would take turns for ever;
        kept, they wait at most their other items' deadlines."""
        if self.prefetch.waited_on(identifier):
            self.items.move(identifier, S.READY, now + self.settings.stage_timeout_s)
        else:
            self.link.release_unused(identifier)

    def _give_up_unwanted(self, identifier: str, state: ItemState, now: float) -> None:
        """A prefetch past its deadline that no request waits for. One still
        queued was never ordered: nothing failed, so nothing holds it off the tiers."""
        why = "no answer in time, and no request waits for it"
        self.give_up(identifier, now, why, fetch_failed=state is S.STAGING)

    def _look_again_if_needed(self, identifier: str) -> None:
        """A lookup answered, or a lookup or claim past its deadline (``ASKED_ABOUT``):
        the requests waiting on it look again. With none left (they ended), its
        record goes, and a claim with it: nothing else would ever move it."""
        if self.waits.needs(identifier):
            self.waits.wake_later((identifier,))
        elif self.items.state(identifier) is S.LOOKING_UP or self.claims is None:
            self.items.move(identifier, S.UNKNOWN)
        else:
            self.claims.release(identifier)

    # -- scheduling ----------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        self.count("lookups")
        self._begin_step()
        state = self.items.state(identifier)
        if state in IN_VLLM:
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
            self.count("lookup_hits")
        return hit

    def _drop_stale(self, identifier: str) -> None:
        """vLLM asks about an item recorded in its encoder cache: it is no longer there."""
        self.items.move(identifier, S.UNKNOWN)
        self.count("stale_items")

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        feature = request.mm_features[index]
        identifier = feature.identifier
        state = self.items.state(identifier)
        if self.is_consumer and state is S.PROMISED:
            self._loads[identifier] = feature.mm_position.get_num_embeds()
            self.mark(identifier, "scheduled")
            self.prefetch.take_waiters(identifier)  # its room is freed once the step ran
            self.items.move(identifier, S.LOADED)
            return
        if state in IN_VLLM:
            self._drop_stale(identifier)
        elif state in FETCHING:  # computed after all: the prefetch is not wanted
            self.prefetch.done(identifier)
            self.prefetch.take_waiters(identifier)
            self.link.cancel(identifier, state)
        self.items.move(identifier, S.RESIDENT)

    def request_finished(self, request_id: str) -> None:
        now = time.monotonic()
        for identifier in self.prefetch.forget_request(request_id):
            item = self.items.get(identifier)  # past its deadline: _expire_due woke the request
            if item and item.state in (S.QUEUED, S.STAGING) and now >= item.deadline:
                self._give_up_unwanted(identifier, item.state, now)
        self.waits.finished(request_id)
        self._active.discard(request_id)
        self._passed_with.pop(request_id, None)
        if self.claims is not None:  # claimed and never computed: others need not wait
            self.claims.release_for(request_id)

    def take_unavailable_requests(self) -> set[str]:
        return self.waits.take_unavailable()

    def _free_loads_run(self) -> None:
        """The last step ran: its loads took the workers' copies, their room is free."""
        for identifier in self._loads_running:
            self.prefetch.done(identifier)
        self._loads_running = []

    def build_connector_meta(self, scheduler_output: Any) -> ECTierConnectorMetadata:
        if not self._polled:  # no request was looked at this step
            self._free_loads_run()
        if self.link.channel_ready():  # worker reports of the last step
            self.link.poll(0.0)
        for identifier in getattr(scheduler_output, "free_encoder_mm_hashes", None) or ():
            if self.items.state(identifier) in IN_VLLM:
                self.items.move(identifier, S.UNKNOWN)
        for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
            self._active.add(new.req_id)
        self._passed.clear()
        self.step.new_step()
        self._polled = False
        now = time.monotonic()
        for identifier in self.items.having(S.PROMISED):  # approved, then not scheduled
            deadline = self.items.get(identifier).deadline
            self.items.move(identifier, S.READY, deadline)
            if now >= deadline:
                self._staged_past_deadline(identifier, now)
        self._expire_due(now)
        self.link.dispatch()
        self.link.flush()
        meta = ECTierConnectorMetadata(loads=self._loads)
        self._loads_running = list(self._loads)
        self._loads = {}
        idle = not getattr(scheduler_output, "total_num_scheduled_tokens", 0)
        if idle and not self.deliver_on_idle:  # metadata that never reaches the workers
            for identifier in self.items.having(S.STAGING):
                if not self.items.get(identifier).direct:
                    self._held_back.add(identifier)
                    self.waits.wake_later((identifier,))
        else:
            self._held_back.clear()
            meta.stage, meta.release, meta.stage_order = self.link.take_orders()
            meta.stage_rows = self.link.rows_of(meta.stage)
        self.waits.drop_news_if_idle()
        return meta

    # -- after the step ------------------------------------------------------

    def update_connector_output(self, meta: ECTierWorkerMetadata | None) -> None:
        """Apply the workers' report of the step (from step metadata)."""
        self.link.apply_report(meta, over_channel=False)

    def take_stats(self) -> dict[str, float]:
        """Scheduler and worker counters since the last call, then reset; with
        the changes of the features off on this side (``known_weights.py``).

        """
        for name, value in self.link.take_channel_counts().items():
            self.count(name, value)
        merged = {f"scheduler_{k}": v for k, v in self.stats.items()}
        merged.update(self.link.take_worker_stats())
        self.stats = {}
        for name, change in self.known.take_off_changes().items():
            merged[name] = merged.get(name, 0) + change  # a worker's may share the name
        return merged

    def close(self, timeout: float) -> None:
        """Withdraw claims still held, stop the index, close the channel: within
        ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        if self.claims is not None:
            self.claims.close(timeout)
        self.index.close(max(deadline - time.monotonic(), 0.0))
        if self.channel is not None:
            self.channel.close()
        if self.timeline is not None:
            self.timeline.close()
