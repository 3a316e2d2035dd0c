"""The worker's stage orders, queued for its staging thread (``worker.py``)."""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class QueuedOrder:
    """A stage order, queued for the staging thread."""

    ids: list[str]
    link: Any  # where it came from: a ``StageLink`` (None: step metadata)
    generation: int  # of the weights it is read under
    weights: str | None  # it was made under (None: not said)
    number: int  # what its answer names (the scheduler's ``Item.order``)

    def answered_alike(self, other: QueuedOrder) -> bool:
        return (self.link, self.generation, self.weights) == (
            other.link,
            other.generation,
            other.weights,
        )


class OrderQueue:
    """Orders in arrival order; ``None`` put in it ends the staging thread."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[QueuedOrder | None] = queue.SimpleQueue()

    def put(self, order: QueuedOrder | None) -> None:
        self._queue.put(order)

    def empty(self) -> bool:
        return self._queue.empty()

    def qsize(self) -> int:
        return self._queue.qsize()

    def next_batches(self) -> list[list[QueuedOrder]] | None:
        """The orders queued now (waiting for the first), in batches; None once closed.

        Consecutive orders to answer alike (same link, generation and weights)
        make one batch: one read for many small orders.
        """
        first = self._queue.get()
        if first is None:
            return None
        batches = [[first]]
        while True:
            try:
                order = self._queue.get_nowait()
            except queue.Empty:
                return batches
            if order is None:
                self._queue.put(None)  # ends the loop after these
                return batches
            if order.answered_alike(batches[-1][-1]):
                batches[-1].append(order)
            else:
                batches.append([order])
