"""Scheduler side: decide per step which items workers stage and load.

Call order per engine step (vLLM's scheduler):

1. ``ensure_cache_available(request)`` — for each item of the request still
   to be computed that the tiers hold (``TierIndex``), queue a *prefetch*: the
   workers fetch it into worker memory in the background, and the request is
   deferred — not the batch — until every tensor-parallel rank reports it
   staged. Prefetches start in arrival order within in-flight bounds
   (``max_inflight_items``, ``max_staged_mb``; see ``PrefetchQueue``) and are
   shared by requests that need the same item. Orders and answers travel over
   the stage channel (``channel.py``), so they reach the workers in steps the
   model runner skips (V1 runs no connector hook in a step with no tokens);
   where the channel cannot reach every rank they ride in step metadata.
   While a channel order is out, the scheduler waits for its answer within a
   per-step budget — long when nothing runs (``idle_stage_wait_s``: a lone
   request loads in the step it arrives), short while requests run
   (``busy_stage_wait_s``, the cost of a read inside the step) — and
   otherwise defers the request to a later step. Deferral is bounded
   (``stage_timeout_s``, ``remote_lookup_timeout_s``); past it the item is
   computed instead — or, on a consumer-only instance, which has no encoder
   work to fall back on, its waiting requests are reported through
   ``take_unavailable_requests`` and vLLM fails them (retryable).
2. ``has_cache_item(id)`` — True only for items staged on every rank (a
   producer-only instance: for items the tiers hold, so it skips re-encoding).
3. ``update_state_after_alloc(request, i)`` — called for computed *and*
   loaded items; only items ``has_cache_item`` approved this step become loads.
4. ``build_connector_meta`` — hands load/release orders (and stage orders
   without a channel) to the workers.
5. after the step: ``update_connector_output`` learns saves, staging results
   and worker stats.

Weights: with ``weights_fingerprint`` on, the index keys items under the
encoder-weights fingerprint the workers announce over the stage channel —
on connect, and after every weight update before the call that made it
returns, so the next step already knows. Until one is known, nothing is
looked up (every item is encoded). On a change, every prefetch queued,
staging or staged is given up (those items are computed) and answers made
under the old weights are ignored.

Why staging: a load placed into vLLM's encoder cache cannot fail later —
the tensor is already in worker memory. A direct tier read at the last moment
could fail after the scheduler committed to skipping the encoder; vLLM's
model runner then raises on the missing entry, and a placeholder tensor would
be reused by later requests. A failed staging simply means the encoder runs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from .channel import StageClient
from .identity import is_content_identifier
from .index import PENDING, TierIndex
from .metadata import ECTierConnectorMetadata, ECTierWorkerMetadata
from .prefetch import PrefetchQueue
from .settings import ConnectorSettings

logger = logging.getLogger(__name__)


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
        self._unavailable: set[str] = set()  # request ids for take_unavailable_requests
        self._failing: set[str] = set()  # reported unavailable, held until vLLM fails them
        self._staging: dict[str, float] = {}  # id -> deadline
        self._staged_ranks: dict[str, int] = {}
        self._ready: set[str] = set()  # staged on every rank
        self._ready_deadline: dict[str, float] = {}
        self._failed: dict[str, float] = {}  # id -> retry after
        self._lookup_deadline: dict[str, float] = {}
        self._resident: set[str] = set()  # mirror of vLLM's encoder cache
        self._hits: set[str] = set()  # has_cache_item said True this step
        self._to_stage: list[str] = []
        self._to_release: list[str] = []
        self._loads: dict[str, int] = {}
        self._undelivered = False  # last step's orders never reached workers
        self.channel = channel
        # Stage orders sent over the channel (not in step metadata), still staging.
        self._direct: set[str] = set()
        self._channel_retry_at = 0.0
        self._active: set[str] = set()  # requests scheduled and not finished
        self._waited = 0.0  # seconds this step spent waiting for staging answers
        self._polled = False  # the channel was read this step
        self._base_identity = index.identity
        # The weights version keys use; None until the workers announce one.
        self.weights: str | None = None if weights_from_workers else index.identity.weights
        self.stats: dict[str, float] = {}
        self.worker_stats: dict[str, float] = {}

    def _count(self, name: str, amount: float = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + amount

    def persistable(self, identifier: str) -> bool:
        return self.settings.persist_non_content_ids or is_content_identifier(identifier)

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
        if identifier in self._ready or identifier in self._resident:
            return True
        if identifier not in self._staging and not self.prefetch.is_queued(identifier):
            answer = self._start_prefetch(identifier, now, nbytes)
            if answer is not None:
                return answer
        if identifier in self._staging:
            if identifier in self._direct:
                # A waiter already: if the staging fails meanwhile, a consumer fails it.
                self.prefetch.wait(identifier, request_id)
                self._await_staging(identifier)
                if identifier not in self._staging:
                    return True  # staged (a load), or given up (computed or failed)
            elif self._undelivered:  # an idle V1 step: the orders never reached the workers
                self._give_up(identifier, now, "idle step", fetch_failed=False)
                return True
            if now < self._staging[identifier]:
                return False
            self._give_up(identifier, now, "staging timed out")
            return True
        if now < self.prefetch.queued_deadline(identifier):
            return False
        self._give_up(identifier, now, "no room to prefetch it in time")
        return True

    def _start_prefetch(self, identifier: str, now: float, nbytes: int) -> bool | None:
        """Queue a prefetch of ``identifier`` if the tiers hold it.

        Returns the answer for ``_item_ready`` when no prefetch starts (True:
        compute it; False: wait for the remote lookup), None once queued.
        """
        retry_after = self._failed.get(identifier)
        if retry_after is not None:
            if now < retry_after:
                return True
            del self._failed[identifier]
        if self.weights is None or not self.persistable(identifier):
            return True
        tier = self.index.lookup(identifier)
        if tier == PENDING:
            deadline = self._lookup_deadline.setdefault(
                identifier, now + self.settings.remote_lookup_timeout_s
            )
            wait = min(self._wait_left(), deadline - now)
            if wait > 0:  # within this step's budget: the answer is a round trip away
                started = time.monotonic()
                self.index.wait_answer(identifier, wait)
                self._waited += time.monotonic() - started
                tier = self.index.lookup(identifier)
            if tier == PENDING:
                return now >= deadline
        self._lookup_deadline.pop(identifier, None)
        if tier is None:
            return True
        if not self.prefetch.fits_at_all(nbytes):
            self._count("prefetch_too_large")
            self._failed[identifier] = now + self.settings.failed_retry_s
            return True
        self.prefetch.enqueue(identifier, now + self.settings.stage_timeout_s, nbytes)
        self._count("prefetch_queued")
        self._dispatch_prefetches()
        return None

    def _budget(self) -> float:
        """Seconds this step may wait on the tiers: long when nothing runs."""
        busy = bool(self._active)
        return self.settings.busy_stage_wait_s if busy else self.settings.idle_stage_wait_s

    def _wait_left(self) -> float:
        return self._budget() - self._waited

    def _await_staging(self, identifier: str) -> None:
        """Wait for the workers' answer about ``identifier``, within this step's budget.

        With nothing else running, a wait stalls nobody (``idle_stage_wait_s``);
        otherwise it delays the running batch as a read inside the step would
        (``busy_stage_wait_s``).
        """
        started = time.monotonic()
        # Never past the staging deadline: then the item is given up as before.
        budget = min(self._budget(), self._waited + self._staging[identifier] - started)
        left = budget - self._waited
        self._poll_channel(0.0)
        while identifier in self._direct and left > 0:
            self._poll_channel(left)
            left = budget - self._waited - (time.monotonic() - started)
        self._waited += time.monotonic() - started

    def _dispatch_prefetches(self) -> None:
        dispatched = [identifier for identifier, _ in self.prefetch.dispatch()]
        if not dispatched:
            return
        deadline = time.monotonic() + self.settings.stage_timeout_s
        direct = self._channel_ready() and self.channel.send(dispatched, self.weights or "")
        for identifier in dispatched:
            self._staging[identifier] = deadline
            self._staged_ranks[identifier] = 0
            if direct:
                self._direct.add(identifier)
            else:
                self._to_stage.append(identifier)
            self._count("stage_orders")

    def _channel_ready(self) -> bool:
        """True if stage orders can go over the channel now (reconnects at most every 10 s)."""
        if self.channel is None:
            return False
        if self.channel.connected:
            return True
        now = time.monotonic()
        if now < self._channel_retry_at:
            return False
        if self.channel.connect():
            logger.info("Stage orders go over the stage channel")
            # Workers announce their weights on connect; take it before deciding anything.
            self._poll_channel(self.settings.idle_stage_wait_s)
            return True
        self._channel_retry_at = now + 10.0
        return False

    def _poll_channel(self, timeout: float) -> None:
        """Apply what the workers said (waiting up to ``timeout`` for the first message)."""
        if self.channel is None:
            return
        now = time.monotonic()
        for message in self.channel.receive(timeout):
            weights = (message.get("weights") or [None])[0]
            if "report" in message:
                self.update_connector_output(ECTierWorkerMetadata.from_message(message))
                continue
            if "staged" not in message and "failed" not in message:
                self._set_weights(weights, now)
                continue
            if weights != self.weights:
                continue  # ordered under weights since replaced
            for identifier in message.get("staged", ()):
                self._note_staged(identifier, 1, now)
            for identifier in message.get("failed", ()):
                self._note_failed(identifier, now)
        if not self.channel.connected:  # broke: nothing more will answer these
            for identifier in list(self._direct):
                self._give_up(identifier, now, "the stage channel broke")

    def _set_weights(self, weights: str | None, now: float) -> None:
        """The workers' encoder weights are now ``weights`` (None: unknown)."""
        if weights == self.weights:
            return
        logger.info("Encoder weights %s -> %s", self.weights, weights)
        self.weights = weights
        self.index.set_identity(dataclasses.replace(self._base_identity, weights=weights or ""))
        doomed = {*self._staging, *self._ready, *self.prefetch.queued()}
        for identifier in doomed:
            self._give_up(identifier, now, "the encoder weights changed", fetch_failed=False)
        self._failed.clear()  # failures under the old weights say nothing now
        self._lookup_deadline.clear()
        self._count("weights_changes")

    def _give_up(self, identifier: str, now: float, why: str, *, fetch_failed: bool = True) -> None:
        """Stop waiting for ``identifier``: compute it, or fail its requests on a consumer."""
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
        else:
            logger.info("Encoder output %.24s will be computed: %s", identifier, why)
            self._failed[identifier] = now + self.settings.failed_retry_s
        was_queued = self.prefetch.is_queued(identifier)
        self.prefetch.done(identifier)
        self._staging.pop(identifier, None)
        self._staged_ranks.pop(identifier, None)
        self._direct.discard(identifier)
        self._ready.discard(identifier)
        self._ready_deadline.pop(identifier, None)
        self.index.forget(identifier)  # the next request looks again
        if was_queued:
            pass  # never ordered
        elif identifier in self._to_stage:
            self._to_stage.remove(identifier)  # never reached the workers
        else:
            self._to_release.append(identifier)
        self._count("stage_given_up")

    # -- scheduling ----------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        self._count("lookups")
        self._begin_step()
        if self.is_consumer:
            hit = identifier in self._ready
        else:
            # Encode-only producer: what the tiers hold need not be encoded again.
            hit = (
                self.weights is not None
                and self.persistable(identifier)
                and self.index.lookup(identifier) not in (None, PENDING)
            )
        if hit:
            self._hits.add(identifier)
            self._count("lookup_hits")
        return hit

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        feature = request.mm_features[index]
        identifier = feature.identifier
        self._resident.add(identifier)
        if not self.is_consumer or identifier not in self._hits:
            return  # computed by the encoder this step (or producer-only)
        self._loads[identifier] = feature.mm_position.get_num_embeds()
        self._ready.discard(identifier)  # consumed from the workers' staging
        self._ready_deadline.pop(identifier, None)
        self.prefetch.done(identifier)
        self.prefetch.take_waiters(identifier)

    def request_finished(self, request_id: str) -> None:
        self.prefetch.forget_request(request_id)
        self._active.discard(request_id)
        self._failing.discard(request_id)

    def take_unavailable_requests(self) -> set[str]:
        unavailable, self._unavailable = self._unavailable, set()
        return unavailable

    def build_connector_meta(self, scheduler_output: Any) -> ECTierConnectorMetadata:
        if self._channel_ready():  # worker reports of the last step
            self._poll_channel(0.0)
        for identifier in getattr(scheduler_output, "free_encoder_mm_hashes", None) or ():
            self._resident.discard(identifier)
        for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
            self._active.add(new.req_id)
        self._waited = 0.0
        self._polled = False
        now = time.monotonic()
        for identifier, deadline in list(self._ready_deadline.items()):
            if now >= deadline:  # staged for a request that never came back
                self._ready.discard(identifier)
                del self._ready_deadline[identifier]
                self.prefetch.done(identifier)
                self.prefetch.take_waiters(identifier)
                self._to_release.append(identifier)
        self._dispatch_prefetches()
        meta = ECTierConnectorMetadata(loads=self._loads)
        self._loads = {}
        self._hits.clear()
        idle = not getattr(scheduler_output, "total_num_scheduled_tokens", 0)
        self._undelivered = idle and not self.deliver_on_idle
        if not self._undelivered:
            meta.stage, self._to_stage = self._to_stage, []
            meta.release, self._to_release = self._to_release, []
        return meta

    # -- after the step ------------------------------------------------------

    def update_connector_output(self, meta: ECTierWorkerMetadata | None) -> None:
        if meta is None:
            return
        now = time.monotonic()
        if meta.weights is not None and meta.weights == self.weights:
            for identifier in meta.saved:
                self.index.note_present(identifier, "worker")
        for identifier in meta.failed:
            self._note_failed(identifier, now)
        for identifier, ranks in meta.staged.items():
            self._note_staged(identifier, ranks, now)
        for name, value in meta.stats.items():
            self.worker_stats[name] = self.worker_stats.get(name, 0) + value

    def _note_staged(self, identifier: str, ranks: int, now: float) -> None:
        if identifier not in self._staging:
            return  # given up meanwhile; its release is already queued
        self._staged_ranks[identifier] += ranks
        if self._staged_ranks[identifier] >= self.tp_size:
            del self._staging[identifier], self._staged_ranks[identifier]
            self._direct.discard(identifier)
            self._ready.add(identifier)
            self._ready_deadline[identifier] = now + self.settings.stage_timeout_s

    def _note_failed(self, identifier: str, now: float) -> None:
        self.index.forget(identifier)
        if identifier in self._staging or identifier in self._ready:
            self._give_up(identifier, now, "a worker could not fetch it")

    def take_stats(self) -> dict[str, float]:
        """Scheduler and worker counters since the last call, then reset.

        vLLM asks right after each step; the workers' reports of that step are
        already on the stage channel.
        """
        if self.channel is not None and self.channel.connected:
            self._poll_channel(0.0)
        merged = {f"scheduler_{k}": v for k, v in self.stats.items()}
        merged.update(self.worker_stats)
        self.stats, self.worker_stats = {}, {}
        return merged
