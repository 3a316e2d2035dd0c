"""The scheduler's line to its workers: stage and release orders out, answers in.

Orders go over the stage channel (``stage_client.py``) when it is connected,
else in the next step's metadata (``build_connector_meta`` takes them). What
comes back, over the channel in arrival order or in the step's metadata, is
applied here: stage answers move their items (STAGING to READY once every
rank staged one; a failure is given up), saves reach the index (and release
their claims), counters add up. A weights announcement goes to the scheduler,
which gives up what the old weights fetched. An answer made under weights
since replaced moves nothing, and neither does one to another order than the
one an item is staging on (``Item.order``): the answer to an order given up
may arrive after the item was ordered again, while the worker has dropped the
old copy and is still reading the new one. A channel that breaks answers
nothing more: its stagings are computed (nothing failed: no retry time).

Why staging: a staged load cannot fail once promised; a tier read at the
last moment could, after the encoder was skipped (vLLM's model runner raises
on the missing entry). A failed staging simply means the encoder runs.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from .connector_options import ConnectorSettings
from .encode_claims import EncodeClaims
from .index import TierIndex
from .items import ItemState, ItemTable
from .metadata import ECTierWorkerMetadata
from .prefetch import PrefetchQueue
from .stage_client import StageClient
from .stage_messages import StageAnswer, WeightsAnnouncement, WorkerReport
from .step_wait import StepWait

logger = logging.getLogger(__name__)

S = ItemState


class LinkOwner(Protocol):
    """What the link asks of its scheduler (``scheduler.py``)."""

    @property
    def weights(self) -> str | None:
        """The weights orders are made and answers taken under."""

    def set_weights(self, weights: str | None, now: float) -> None:
        """The workers' weights changed: give up what the old ones fetched."""

    def give_up(self, identifier: str, now: float, why: str) -> None:
        """Stop waiting for ``identifier``'s staging."""

    def count(self, name: str, amount: float = 1) -> None:
        """Add to one of the scheduler's counters."""

    def mark(self, identifier: str, event: str) -> None:
        """Record ``event`` in ``identifier``'s timeline."""


class WorkerLink:
    """Stage orders of one scheduler and the workers' answers to them."""

    def __init__(
        self,
        owner: LinkOwner,
        channel: StageClient | None,
        settings: ConnectorSettings,
        items: ItemTable,
        prefetch: PrefetchQueue,
        index: TierIndex,
        step: StepWait,
        *,
        tp_size: int,
        claims: EncodeClaims | None,
        weights_from_reports: bool,
    ) -> None:
        self.owner = owner
        self.channel = channel
        self.settings = settings
        self.items = items
        self.prefetch = prefetch
        self.index = index
        self.step = step
        self.tp_size = tp_size
        self.claims = claims
        # The workers fingerprint their weights: without a channel, their reports say it.
        self._weights_from_reports = weights_from_reports
        # Orders of this step not sent over the channel, handed out by take_orders.
        self._to_stage: list[str] = []
        self._to_release: list[str] = []
        # The number of the next step metadata's stage order (the channel's
        # orders are numbered by ``StageClient.send``).
        self._meta_order = 1
        self._worker_stats: dict[str, float] = {}

    @property
    def weights(self) -> str | None:
        return self.owner.weights

    @property
    def connected(self) -> bool:
        return self.channel is not None and self.channel.connected

    def channel_ready(self) -> bool:
        """True if stage orders can go over the channel now."""
        if self.channel is None:
            return False
        if self.channel.connected:
            return True
        self._requeue_lost_releases()  # sent first on the new connection
        if not self.channel.reconnect():
            return False
        logger.info("Stage orders go over the stage channel")
        # Workers announce their weights on connect; take it before deciding
        # anything, within what is left of this step's budget.
        self.step.wait(self.poll, self.settings.idle_stage_wait_s)
        return True

    def poll(self, timeout: float) -> None:
        """Apply what the workers said (waiting up to ``timeout`` for the first message)."""
        if self.channel is None:
            return
        now = time.monotonic()
        for message in self.channel.receive(timeout):
            match message:
                case WorkerReport():
                    self.apply_report(ECTierWorkerMetadata.from_report(message), over_channel=True)
                case WeightsAnnouncement(weights=weights):
                    self.owner.set_weights(weights, now)
                case StageAnswer(weights=weights) if weights == self.weights:
                    for identifier in message.staged:
                        self.staged(identifier, 1, now, order=message.order, direct=True)
                    for identifier in message.failed:
                        self.failed(identifier, now, order=message.order, direct=True)
                case StageAnswer():
                    pass  # ordered under weights since replaced
        if not self.channel.connected:  # broke: nothing more will answer these
            for identifier in self.items.having(S.STAGING):
                if self.staging_direct(identifier):
                    self.owner.give_up(
                        identifier, now, "the stage channel broke", fetch_failed=False
                    )

    def take_channel_counts(self) -> dict[str, float]:
        """The stage channel's counters since the last call, after reading what the
        workers said: vLLM asks for stats right after each step, and the workers'
        reports of that step are already on the channel."""
        if self.channel is None:
            return {}
        if self.channel.connected:
            self.poll(0.0)
        return self.channel.take_counts()

    # -- orders --------------------------------------------------------------

    def dispatch(self) -> None:
        """Order the stagings the prefetch queue lets start now."""
        if not self.prefetch.queued():
            return
        # Connect before taking items out of the queue: a reconnect hears the
        # workers' weights, and a change gives up (computes) what is queued.
        self.channel_ready()
        started = self.prefetch.dispatch()  # each with its deadline: queueing counts
        if not started:
            return
        dispatched = [identifier for identifier, _ in started]
        # Releases first: a worker must drop an old copy before staging it anew.
        order: int = (  # its number; 0 (or False): not sent over the channel
            self.connected
            and self._send_releases()
            and self.channel.send(dispatched, self.weights or "", self.rows_of(dispatched))
        )
        direct = order > 0
        if not direct:
            order = self._meta_order  # the next step metadata's
            self._to_stage.extend(dispatched)
        for identifier, deadline in started:
            self.items.stage(identifier, deadline, direct=direct, order=order)
            self.owner.mark(identifier, "stage_sent")
        self.owner.count("stage_orders", len(dispatched))

    def staging_direct(self, identifier: str) -> bool:
        """Whether ``identifier`` is staging on an order sent over the channel."""
        item = self.items.get(identifier)
        return item is not None and item.state is S.STAGING and item.direct

    def cancel(self, identifier: str, state: ItemState) -> None:
        """Take back the stage order of an item that was in ``state``."""
        if state is S.QUEUED:
            pass  # never ordered
        elif identifier in self._to_stage:
            self._to_stage.remove(identifier)  # never reached the workers
        elif state in (S.STAGING, S.READY, S.PROMISED):
            self._to_release.append(identifier)

    def release_unused(self, identifier: str) -> None:
        """A staged item's deadline passed unused (its request is gone): free its memory."""
        self.items.move(identifier, S.UNKNOWN)
        self.prefetch.done(identifier)
        self.prefetch.take_waiters(identifier)
        self._to_release.append(identifier)

    def _requeue_lost_releases(self) -> None:
        """Releases a channel break kept from a worker go out again, ahead of any
        order sent since: else that worker holds their copies until the weights change."""
        if self.channel is not None:
            self._to_release[:0] = self.channel.take_lost_releases()

    def _send_releases(self) -> bool:
        """Send the queued releases over the channel; False if it cannot take them."""
        if self._to_release and self.channel is not None:
            if not self.channel.send_release(self._to_release):
                return False
            self._to_release = []
        return True

    def flush(self) -> None:
        """Send this step's orders over the channel, in as few writes as they fit.

        Releases go over the channel too while it is connected: in step
        metadata, a release could reach a worker after a stage order for the
        same item sent over the channel since, and drop the new copy.
        """
        if self.connected:
            self._send_releases()
        if self.channel is not None:
            self.channel.flush()

    def rows_of(self, identifiers: list[str]) -> dict[str, int]:
        """The rows each of ``identifiers`` is staged for (those said)."""
        said = ((i, self.prefetch.rows(i)) for i in identifiers)
        return {identifier: rows for identifier, rows in said if rows}

    def take_orders(self) -> tuple[list[str], list[str], int]:
        """This step's stage and release orders for the step metadata (releases the
        channel did not take), and the stage order's number (0: none)."""
        self._requeue_lost_releases()
        order = 0
        if self._to_stage:
            order, self._meta_order = self._meta_order, self._meta_order + 1
        orders = self._to_stage, self._to_release, order
        self._to_stage, self._to_release = [], []
        return orders

    # -- answers -------------------------------------------------------------

    def answers(self, identifier: str, order: int, *, direct: bool) -> bool:
        """Whether an answer to stage order ``order`` (sent over the channel:
        ``direct``) is one to the order ``identifier`` is staged on.

        Each rank answers an order once, so counting such answers counts ranks
        (and none is left for an item READY: its record keeps no order). An
        answer that names no order (0: ``StageLink.answer``, or a report made
        without ``orders``) is taken for whatever order is under way.
        """
        item = self.items.get(identifier)
        if item is None:
            return False
        return order == 0 or (item.order == order and item.direct == direct)

    def staged(self, identifier: str, ranks: int, now: float, *, order: int, direct: bool) -> None:
        """``ranks`` more ranks staged ``identifier`` on stage order ``order``."""
        if self.items.state(identifier) is not S.STAGING:
            return  # given up meanwhile; its release is already queued
        if not self.answers(identifier, order, direct=direct):
            return  # an order given up: the copy it staged is released, or will be
        if self.items.add_ranks(identifier, ranks) >= self.tp_size:
            self.items.move(identifier, S.READY, now + self.settings.stage_timeout_s)
            self.owner.mark(identifier, "staged")

    def failed(self, identifier: str, now: float, *, order: int, direct: bool) -> None:
        """A worker could not fetch ``identifier`` on stage order ``order``."""
        self.index.forget(identifier)
        if self.items.state(identifier) in (S.STAGING, S.READY, S.PROMISED) and self.answers(
            identifier, order, direct=direct
        ):
            self.owner.give_up(identifier, now, "a worker could not fetch it")

    def apply_report(self, meta: ECTierWorkerMetadata | None, *, over_channel: bool) -> None:
        """Apply a workers' report (from step metadata, or ``over_channel``)."""
        if meta is None:
            return
        now = time.monotonic()
        if self._weights_from_reports and not over_channel and not self.connected:
            # No stage channel: the fingerprint comes with the step reports.
            self.owner.set_weights(meta.weights, now)
        if meta.weights is not None and meta.weights == self.weights:
            for identifier in meta.saved:
                self.index.note_present(identifier, "worker")
                if self.claims is not None:
                    self.claims.release(identifier)  # others load it now
        if meta.weights == self.weights:  # stagings answered under other weights move nothing
            for identifier in meta.failed:
                self.failed(identifier, now, order=meta.orders.get(identifier, 0), direct=False)
            for identifier, ranks in meta.staged.items():
                order = meta.orders.get(identifier, 0)
                self.staged(identifier, ranks, now, order=order, direct=False)
        for name, value in meta.stats.items():
            self._worker_stats[name] = self._worker_stats.get(name, 0) + value

    def take_worker_stats(self) -> dict[str, float]:
        """The workers' counters since the last call."""
        stats, self._worker_stats = self._worker_stats, {}
        return stats
