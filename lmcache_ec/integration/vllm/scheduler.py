"""Scheduler side: decide per step which items workers stage and load.

Call order per engine step (vLLM's scheduler):

1. ``ensure_cache_available(request)`` — for each item of the request still
   to be computed that the tiers hold (``TierIndex``), order the workers to
   *stage* it (fetch into worker memory, in the background) and defer the
   request until every tensor-parallel rank reports it staged. Deferral is
   bounded (``stage_timeout_s``, ``remote_lookup_timeout_s``); past it the
   item is computed instead.
2. ``has_cache_item(id)`` — True only for items staged on every rank (a
   producer-only instance: for items the tiers hold, so it skips re-encoding).
3. ``update_state_after_alloc(request, i)`` — called for computed *and*
   loaded items; only items ``has_cache_item`` approved this step become loads.
4. ``build_connector_meta`` — hands stage/load/release orders to the workers.
5. after the step: ``update_connector_output`` learns saves, staging results
   and worker stats.

Why staging: a load placed into vLLM's encoder cache cannot fail later —
the tensor is already in worker memory. A direct tier read at the last moment
could fail after the scheduler committed to skipping the encoder; vLLM's
model runner then raises on the missing entry, and a placeholder tensor would
be reused by later requests. A failed staging simply means the encoder runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .identity import is_content_identifier
from .index import PENDING, TierIndex
from .metadata import ECTierConnectorMetadata, ECTierWorkerMetadata
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
    ) -> None:
        self.settings = settings
        self.index = index
        self.is_producer = is_producer
        self.is_consumer = is_consumer
        self.tp_size = max(1, tp_size)
        # The V1 model runner skips connector hooks in steps with no tokens.
        self.deliver_on_idle = deliver_on_idle
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
        self.stats: dict[str, float] = {}
        self.worker_stats: dict[str, float] = {}

    def _count(self, name: str, amount: float = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + amount

    def persistable(self, identifier: str) -> bool:
        return self.settings.persist_non_content_ids or is_content_identifier(identifier)

    # -- before scheduling ---------------------------------------------------

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        if not self.is_consumer:
            return True
        now = time.monotonic()
        ready = True
        for feature in request.mm_features:
            pos = feature.mm_position
            if pos.offset + pos.length <= num_computed_tokens:
                continue
            if not self._item_ready(feature.identifier, now):
                ready = False
        if not ready:
            self._count("deferred_steps")
        return ready

    def _item_ready(self, identifier: str, now: float) -> bool:
        """False while ``identifier`` is on its way into worker memory."""
        if identifier in self._ready or identifier in self._resident:
            return True
        if identifier in self._staging:
            if now < self._staging[identifier] and not self._undelivered:
                return False
            self._give_up(identifier, now, "staging timed out")
            return True
        retry_after = self._failed.get(identifier)
        if retry_after is not None:
            if now < retry_after:
                return True
            del self._failed[identifier]
        if not self.persistable(identifier):
            return True
        tier = self.index.lookup(identifier)
        if tier == PENDING:
            deadline = self._lookup_deadline.setdefault(
                identifier, now + self.settings.remote_lookup_timeout_s
            )
            return now >= deadline
        self._lookup_deadline.pop(identifier, None)
        if tier is None:
            return True
        self._staging[identifier] = now + self.settings.stage_timeout_s
        self._staged_ranks[identifier] = 0
        self._to_stage.append(identifier)
        self._count("stage_orders")
        return False

    def _give_up(self, identifier: str, now: float, why: str) -> None:
        logger.info("Encoder output %.24s will be computed: %s", identifier, why)
        self._staging.pop(identifier, None)
        self._staged_ranks.pop(identifier, None)
        self._ready.discard(identifier)
        self._ready_deadline.pop(identifier, None)
        self._failed[identifier] = now + self.settings.failed_retry_s
        if identifier in self._to_stage:
            self._to_stage.remove(identifier)  # never reached the workers
        else:
            self._to_release.append(identifier)
        self._count("stage_given_up")

    # -- scheduling ----------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        self._count("lookups")
        if self.is_consumer:
            hit = identifier in self._ready
        else:
            # Encode-only producer: what the tiers hold need not be encoded again.
            hit = self.persistable(identifier) and self.index.lookup(identifier) not in (
                None,
                PENDING,
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

    def build_connector_meta(self, scheduler_output: Any) -> ECTierConnectorMetadata:
        for identifier in getattr(scheduler_output, "free_encoder_mm_hashes", None) or ():
            self._resident.discard(identifier)
        now = time.monotonic()
        for identifier, deadline in list(self._ready_deadline.items()):
            if now >= deadline:  # staged for a request that never came back
                self._ready.discard(identifier)
                del self._ready_deadline[identifier]
                self._to_release.append(identifier)
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
        for identifier in meta.saved:
            self.index.note_present(identifier, "worker")
        for identifier in meta.failed:
            self.index.forget(identifier)
            if identifier in self._staging or identifier in self._ready:
                self._give_up(identifier, now, "a worker could not stage it")
        for identifier, ranks in meta.staged.items():
            if identifier not in self._staging:
                continue  # given up meanwhile; its release is already queued
            self._staged_ranks[identifier] += ranks
            if self._staged_ranks[identifier] >= self.tp_size:
                del self._staging[identifier], self._staged_ranks[identifier]
                self._ready.add(identifier)
                self._ready_deadline[identifier] = now + self.settings.stage_timeout_s
        for name, value in meta.stats.items():
            self.worker_stats[name] = self.worker_stats.get(name, 0) + value

    def take_stats(self) -> dict[str, float]:
        """Scheduler and worker counters since the last call, then reset."""
        merged = {f"scheduler_{k}": v for k, v in self.stats.items()}
        merged.update(self.worker_stats)
        self.stats, self.worker_stats = {}, {}
        return merged
