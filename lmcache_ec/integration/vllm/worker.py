"""Worker side: stage, load and save encoder outputs through an ``ECCache``.

Per engine step (both the V1 model-runner mixin and the V2 runner):
``bind_connector_metadata`` → ``start_load_caches`` (releases, then this
step's loads in one batch, then new staging orders handed to a thread) →
encoder → ``save_caches`` per new output (hand-off, returns at once) →
``build_connector_worker_meta`` (saves, staging results, stats).

Weights: with ``weights_fingerprint`` on, keys carry a fingerprint of the
encoder weights (``set_weights``, called once the model is resident and after
every update). Until it is known nothing is staged, read or saved; when it
changes, in-flight stagings answer nothing (the scheduler gives every order
of the old weights up on hearing the change), saves queued before the change
still land under the weights that computed them, and saves reported since the
last report are not reported under the new weights. Staged copies are kept
for loads only until the scheduler loads or releases them (``staged_copies.py``).
The step report after a change carries the new version (it counts the
change, so it is never empty): without a stage channel, that is how the
scheduler learns it.

Staging reads the tiers with one ``get_many`` per order batch in a
background thread into worker memory (CPU tensors, ``max_staged_mb``); a
load only moves a staged tensor into vLLM's encoder cache (``.to(device)``),
so it cannot miss. Each answer names the order it answers (``QueuedOrder.number``):
the scheduler takes it for that order only. Every rank stages on its own;
one rank writes each item when a tier is shared (disk, node or remote),
chosen by a hash of the identifier so writes spread over ranks; with only a
CPU tier every rank writes its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ...engine import ECCache
from ...key import ECKey, EncoderIdentity
from ...runtime_dirs import Feature, Reason
from .channel import StageLink
from .connector_options import ConnectorSettings
from .features_off import OffChanges
from .metadata import ECTierConnectorMetadata, ECTierWorkerMetadata
from .saver import SaveQueue
from .stage_messages import StageAnswer
from .stage_orders import OrderQueue, QueuedOrder
from .staged_copies import StagedCopies
from .stats import flat_counters
from .timeline import WorkerTimeline

logger = logging.getLogger(__name__)

# How long a read copy waits for memory a running step's loads free: with async
# scheduling, orders come while the step that loads the last copies still runs.
ROOM_WAIT_S = 1.0


def writer_rank(identifier: str, tp_size: int) -> int:
    """The rank (of all TP x PCP workers) that writes ``identifier``."""
    digest = hashlib.blake2b(identifier.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % tp_size


class TierWorker:
    def __init__(
        self,
        cache: ECCache,
        settings: ConnectorSettings,
        *,
        persistable: Callable[[str], bool],
        is_producer: bool,
        is_consumer: bool,
        tp_rank: int = 0,
        tp_size: int = 1,
        device: str | torch.device = "cpu",
        weights_known: bool = True,
    ) -> None:
        self.cache = cache
        self.base_identity = cache.identity
        # The identity's weights version; None until a fingerprint is taken.
        self.weights: str | None = cache.identity.weights if weights_known else None
        self._generation = 0  # bumped on every weights change
        self.settings = settings
        self.persistable = persistable
        self.is_producer = is_producer
        self.is_consumer = is_consumer
        self.tp_rank = tp_rank
        self.tp_size = max(1, tp_size)
        self.device = torch.device(device)
        self.shared_tier = cache.config.shared_tier
        self._lock = threading.Lock()  # guards everything below, the staged copies too
        self.staged = StagedCopies(int(settings.max_staged_mb * 1024 * 1024))
        self._copy_taken = threading.Condition(self._lock)
        self._saved: set[str] = set()
        # Saves still being written below the CPU tier: their ``saved`` report
        # withdraws their claims, so it waits for the write (see _take_landed).
        self._landing: dict[str, tuple[EncoderIdentity, ECKey, float]] = {}
        self._hold_saves = settings.claim_encodes and is_producer and is_consumer
        self._staged_report: set[str] = set()
        self._failed: set[str] = set()
        self._answered: dict[str, int] = {}  # reported: the order number answered
        # Stage orders received per link: an order's number is its place there.
        self._link_orders: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._counters: dict[str, float] = {}
        self._cache_stats = flat_counters(cache.stats.snapshot())
        self._off: dict[str, str] = {}  # features this worker turned off itself
        self._off_changes = OffChanges()
        # Orders from step metadata (answered in worker metadata) or from the
        # stage channel (answered on its link).
        self._stage_queue = OrderQueue()
        self._stager = threading.Thread(target=self._stage_loop, name="ec-stage", daemon=True)
        self._stager.start()
        self._saver = SaveQueue(self._put, self._save_done, settings.max_pending_saves)
        self.timeline: WorkerTimeline | None = None  # ec.timeline_path

    def feature_off(self, feature: Feature, reason: Reason) -> None:
        """Report ``feature`` off (with the cache's own, ``features_off``)."""
        with self._lock:
            self._off[feature.value] = reason.value

    @property
    def staged_bytes(self) -> int:
        """Bytes of staged tensors held for loads."""
        with self._lock:
            return self.staged.nbytes

    def record(self, name: str, amount: float) -> None:
        """Add ``amount`` to counter ``name`` (reported with the next step)."""
        self._count(name, amount)

    def _count(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + amount

    def set_weights(self, weights: str | None) -> bool:
        """Key everything under encoder weights ``weights`` (None: unknown).

        Returns True if that changed anything. Staged copies of the old
        weights are kept for loads only; stagings in flight answer nothing;
        saves not reported yet are not reported under ``weights``.
        """
        with self._lock:
            if weights == self.weights:
                return False
            self.weights = weights
            self._generation += 1
            identity = dataclasses.replace(self.base_identity, weights=weights or "")
            self.cache.set_identity(identity)
            # A scheduler one report behind may have promised one of them this
            # step; never answered, re-staged or saved. No "failed" reports for
            # them: the scheduler gives every old-weights item up on hearing the
            # change, and a late report could fail a new order of the same item
            # under the new weights.
            kept = self.staged.keep_for_loads()
            self._staged_report.clear()
            # Saved under the old weights: the next report speaks for the new ones.
            self._saved.clear()
            self._counters["weights_changes"] = self._counters.get("weights_changes", 0) + 1
        logger.info("Encoder weights now %s; %d staged outputs kept for loads only", weights, kept)
        return True

    def _put(self, identifier: str, tensor: torch.Tensor, identity: EncoderIdentity) -> bool:
        return self.cache.put(identifier, tensor, identity=identity)

    # -- loads ---------------------------------------------------------------

    def start_load_caches(
        self, encoder_cache: dict[str, torch.Tensor], meta: ECTierConnectorMetadata
    ) -> None:
        started = time.perf_counter()
        self.release(meta.release)
        placed = 0
        missing = []
        for identifier in meta.loads:
            tensor = self._take_staged(identifier)
            if identifier in encoder_cache:
                continue
            if tensor is None:
                missing.append(identifier)
                continue
            # Staged in page-locked memory on CUDA: the copy is queued on the
            # current stream, ahead of the encoder-output consumers.
            encoder_cache[identifier] = tensor.to(self.device, non_blocking=True)
            placed += 1
            if self.timeline is not None:
                self.timeline.item(identifier, "loaded")
        if missing:
            placed += self._read_directly(encoder_cache, missing)
        if meta.loads:
            self._count("loads", placed)
            self._count("load_seconds", time.perf_counter() - started)
        if meta.stage:
            self.stage(list(meta.stage), None, None, meta.stage_order, rows=meta.stage_rows)

    def _read_directly(self, encoder_cache: dict[str, torch.Tensor], missing: list[str]) -> int:
        """Unreachable while staging holds its invariant: one batch read as a last
        resort, and vLLM reports anything still missing. How many it placed.

        Never while the weights are unknown: the cache's identity then names no
        weights (``weights=""``), the key of a deployment without a fingerprint.
        """
        with self._lock:
            known = self.weights is not None
        if not known:
            logger.error("Staged encoder outputs missing; none read, weights unknown")
            self._count("load_misses_weights_unknown", len(missing))
            return 0
        logger.error("Staged encoder outputs missing; reading %d directly", len(missing))
        self._count("load_direct_reads", len(missing))
        placed = 0
        for identifier, tensor in zip(
            missing, self.cache.get_many(missing, self.device), strict=True
        ):
            if tensor is not None:
                encoder_cache[identifier] = tensor
                placed += 1
        return placed

    def stage(
        self,
        identifiers: list[str],
        weights: str | None,
        link: StageLink | None,
        number: int = 0,
        *,
        rows: dict[str, int] | None = None,
    ) -> None:
        """Fetch ``identifiers`` into worker memory in the background (each of
        its ``rows``: another length is refused, see ``StagedCopies.hold``).

        ``weights``: the weights version the order was made under (None: not
        said, as in step metadata). The answer goes back on ``link`` (an order
        from the stage channel), or in the next worker metadata. It names the
        order's ``number``: in step metadata, the scheduler's ``stage_order``;
        over the channel, the order's place on its link (1, 2, …), as the
        scheduler's ``StageClient.send`` numbers it.
        """
        with self._lock:
            if link is not None:
                number = self._link_orders[link] = self._link_orders.get(link, 0) + 1
            current = self.weights
            stale = current is None or (weights is not None and weights != current)
            if not stale:
                self.staged.order(identifiers, rows)
                generation = self._generation
        if stale:  # ordered under other weights, or none known yet: nothing to load
            self._count("stage_refused_weights", len(identifiers))
            self._answer(QueuedOrder(identifiers, link, -1, weights, number), [], identifiers)
            return
        self._stage_queue.put(QueuedOrder(identifiers, link, generation, current, number))

    def _answer(self, order: QueuedOrder, staged: list[str], failed: list[str]) -> None:
        """Report how ``order`` went, under the weights it was made under."""
        link, weights = order.link, order.weights or ""
        if isinstance(link, StageLink):
            link.send(StageAnswer(tuple(staged), tuple(failed), weights, order.number))
        elif link is not None:  # another kind of link: it takes answers unnumbered
            link.answer(staged, failed, weights)
        else:
            self._report(order.number, staged, failed)

    def _report(self, number: int, staged: list[str], failed: list[str]) -> None:
        """Queue answers to step-metadata order ``number`` for the next report; an
        item keeps the answer to its newest order (numbers grow)."""
        with self._lock:
            for identifiers, answers, other in (
                (staged, self._staged_report, self._failed),
                (failed, self._failed, self._staged_report),
            ):
                for identifier in identifiers:
                    if self._answered.get(identifier, 0) <= number:
                        self._answered[identifier] = number
                        answers.add(identifier)
                        other.discard(identifier)

    def _take_staged(self, identifier: str) -> torch.Tensor | None:
        """Take ``identifier``'s staged copy out for a load (None: none)."""
        with self._lock:
            tensor, kept = self.staged.take(identifier)
            self._copy_taken.notify_all()
            if kept:  # promised before the scheduler heard of a weights change
                self._counters["loads_kept_across_weights"] = (
                    self._counters.get("loads_kept_across_weights", 0) + 1
                )
            return tensor

    def release(self, identifiers: Iterable[str]) -> None:
        """Drop the staged copies of ``identifiers`` (no longer wanted)."""
        with self._lock:
            for identifier in identifiers:
                self.staged.take(identifier)
            self._copy_taken.notify_all()

    def _stage_loop(self) -> None:
        while (batches := self._stage_queue.next_batches()) is not None:
            for batch in batches:
                self._stage_one(batch)
            if self._stage_queue.empty():
                self._promote_before_the_step()

    def _promote_before_the_step(self) -> None:
        """Copy this batch's disk hits into the CPU tier now, right after the answer.

        The cache's own thread would promote them once reads have been quiet
        for a while, which is in the middle of the step that loads them: its
        Python competes with that step's forward pass for the interpreter (and,
        on a CPU host, for the core), so the load that the staging made free
        costs its request several ms anyway. Between the answer and that step
        the scheduler is still scheduling: the promotion costs nobody.
        """
        try:
            promoted = self.cache.promote_now()
        except Exception as exc:  # a promotion only ever costs speed
            logger.debug("Promotion after staging failed: %s", exc)
            return
        if promoted:
            self._count("promoted_after_staging", promoted)

    def _stage_one(self, batch: list[QueuedOrder]) -> None:
        """Read the items of ``batch`` (orders answered alike) at once; answer each order."""
        identifiers = list(dict.fromkeys(i for order in batch for i in order.ids))
        started = time.perf_counter()
        try:
            tensors = self.cache.get_many(identifiers, "cpu", pin_memory=self.device.type == "cuda")
        except Exception as exc:  # a closed or broken cache: compute instead
            logger.warning("Staging %d encoder outputs failed: %s", len(identifiers), exc)
            tensors = [None] * len(identifiers)
        staged, failed = set(), set()
        with self._lock:
            self._counters["stage_seconds"] = (
                self._counters.get("stage_seconds", 0) + time.perf_counter() - started
            )
            if batch[0].generation != self._generation:
                # Read under weights since replaced: the scheduler gave these orders
                # up on hearing the change, and what is wanted now (an order of the
                # same item under the new weights) is not theirs to answer.
                return
            room_by = time.monotonic() + ROOM_WAIT_S
            for identifier, tensor in zip(identifiers, tensors, strict=True):
                if tensor is not None and not self.staged.fits(tensor):
                    self._counters["stage_room_waits"] = (
                        self._counters.get("stage_room_waits", 0) + 1
                    )
                    self._copy_taken.wait_for(
                        lambda t=tensor: self.staged.fits(t), room_by - time.monotonic()
                    )
                    if batch[0].generation != self._generation:
                        return  # the weights changed meanwhile, as above
                if not self.staged.is_wanted(identifier):
                    continue  # released while in flight
                (staged if self.staged.hold(identifier, tensor) else failed).add(identifier)
            wrong, self.staged.wrong_rows = self.staged.wrong_rows, []
            if wrong:
                self._counters["stage_wrong_rows"] = self._counters.get(
                    "stage_wrong_rows", 0
                ) + len(wrong)
        for identifier, rows, expected in wrong:
            logger.warning(
                "Encoder output %.24s has %d rows, its request %d placeholders (a client "
                "multimodal UUID reused for other content?): not staged",
                *(identifier, rows, expected),
            )
        read_at = time.time()
        for order in batch:
            self._answer(
                order,
                [i for i in order.ids if i in staged],
                [i for i in order.ids if i in failed],
            )
        if self.timeline is not None:  # after the answer: off the hit's path
            for identifier in staged:
                self.timeline.item(identifier, "read", read_at)

    # -- saves ---------------------------------------------------------------

    def save_caches(self, encoder_cache: dict[str, torch.Tensor], mm_hash: str) -> None:
        if not self.is_producer:
            return
        # No "saved already" shortcut: vLLM saves only what it computed, so
        # the scheduler found no tier holding it (evicted, purged) or gave its
        # fetch up; a put of an entry still held stores nothing again.
        started = time.perf_counter()
        with self._lock:
            identity = self.cache.identity if self.weights is not None else None
        if identity is None:  # weights not fingerprinted yet: no key can be trusted
            self._count("saves_skipped_weights_unknown")
            return
        if not self.persistable(mm_hash):
            self._count("saves_skipped_identifier")
            return
        other_rank_writes = (
            self.tp_size > 1
            and self.shared_tier
            and writer_rank(mm_hash, self.tp_size) != self.tp_rank
        )
        if other_rank_writes:
            return
        tensor = encoder_cache.get(mm_hash)
        if tensor is None:
            return
        if tensor.requires_grad:  # never under vLLM's inference mode; detach() costs µs
            tensor = tensor.detach()
        if self._saver.submit(mm_hash, tensor, identity):
            self._count("saves_submitted")
        else:
            self._count("saves_dropped")
        self._count("save_handoff_seconds", time.perf_counter() - started)

    def _save_done(
        self, identifier: str, stored: bool, seconds: float, identity: EncoderIdentity
    ) -> None:
        key = identity.key(identifier) if stored and self._hold_saves else None
        writing = key is not None and self.cache.writing_below(key)
        with self._lock:
            if identity != self.cache.identity:
                return  # saved under weights since replaced: not news for the scheduler
            if writing:
                landing_by = time.monotonic() + self.settings.claim_wait_s
                self._landing[identifier] = (identity, key, landing_by)
            elif stored:
                self._saved.add(identifier)
            else:
                self._counters["save_failures"] = self._counters.get("save_failures", 0) + 1

    def _take_landed(self) -> None:
        """Saves whose write below the CPU tier finished become ``saved``: a claim
        withdrawn before would let another instance find neither output nor claim.
        A write still running after ``claim_wait_s`` is reported anyway: instances
        waiting on the claim stop waiting then, and this instance's scheduler
        learns only from the report that the worker holds the output. A set lookup
        per tier: never waits."""
        now = time.monotonic()
        with self._lock:
            landing = list(self._landing.items())
        landed = [
            (identifier, entry)
            for identifier, entry in landing
            if now >= entry[2] or not self.cache.writing_below(entry[1])
        ]
        with self._lock:
            for identifier, entry in landed:
                if self._landing.get(identifier) is entry:
                    del self._landing[identifier]
                    if entry[0] == self.cache.identity:  # else saved under replaced weights
                        self._saved.add(identifier)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait for queued saves (and the tiers' own write-behind)."""
        return self._saver.flush(timeout) and self.cache.flush(timeout)

    # -- reporting -----------------------------------------------------------

    def build_worker_meta(self) -> ECTierWorkerMetadata | None:
        if self._landing:
            self._take_landed()
        snapshot = self.cache.stats.snapshot()
        current = flat_counters(snapshot)
        with self._lock:
            # Counters only grow (the scheduler refuses a report of one below zero):
            # one that went down (a tier's own, left out of a snapshot) reports
            # nothing until it passes its old high again.
            stats: dict[str, float] = {}
            for name, value in current.items():
                if value > self._cache_stats.get(name, 0):
                    stats[name] = value - self._cache_stats.get(name, 0)
                    self._cache_stats[name] = value
            for name, value in self._counters.items():
                stats[name] = stats.get(name, 0) + value
            stats.update(self._off_changes.take({**snapshot["features_off"], **self._off}))
            meta = ECTierWorkerMetadata(
                weights=self.weights,
                saved=self._saved,
                staged={identifier: 1 for identifier in self._staged_report},
                failed=self._failed,
                stats=stats,
                orders={i: self._answered[i] for i in self._staged_report | self._failed},
            )
            self._saved, self._staged_report, self._failed = set(), set(), set()
            self._answered = {}
            self._counters = {}
        return None if meta.is_empty() else meta

    def close(self) -> None:
        """Flush saves and writes, stop the threads: all within one ``close_timeout``."""
        deadline = time.monotonic() + self.cache.config.close_timeout

        def left() -> float:
            return max(deadline - time.monotonic(), 0.0)

        self._saver.close(left())
        self._stage_queue.put(None)
        self._stager.join(left())
        self.cache.close(timeout=left())
        if self.timeline is not None:
            self.timeline.close()
