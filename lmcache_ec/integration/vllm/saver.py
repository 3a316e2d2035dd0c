"""Background saves: ``submit`` returns at once, a thread does the put.

Tensor lifetime (why the hand-off is safe):

- An accelerator tensor is copied, in ``submit``, into a fresh page-locked
  host buffer with ``non_blocking=True`` on the *current* stream, and an
  event is recorded after the copy. The copy is stream-ordered after the
  encoder kernels that produced the tensor and before anything vLLM later
  enqueues on that stream — so freeing or overwriting the tensor afterwards
  cannot race it. The thread waits on the event, never on the stream.
- A CPU tensor is handed over by reference: vLLM replaces or drops
  encoder-cache entries and never writes into them, and the put copies the
  bytes into the tier's own frame.

When ``max_pending`` saves are queued, ``submit`` refuses (returns False)
rather than make the forward pass wait. A hand-off that fails (host or pinned
memory exhausted, a device error) is refused the same way, never an
exception in the forward pass: its slot is given back. A failure, of the
hand-off or of the put, is logged the first time of each kind (under memory
pressure, or with outputs larger than the tier, it recurs at every save).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

PutFn = Callable[[str, torch.Tensor, Any], bool]  # identifier, tensor, the submit's tag
DoneFn = Callable[[str, bool, float, Any], None]  # identifier, stored, put seconds, tag


class SaveQueue:
    def __init__(self, put: PutFn, done: DoneFn, max_pending: int) -> None:
        self._put = put
        self._done = done
        self.max_pending = max(1, max_pending)
        self._pending = 0
        self._lock = threading.Condition()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._failures_logged: set[tuple[str, str]] = set()  # (step, exception type)
        self._thread = threading.Thread(target=self._loop, name="ec-save", daemon=True)
        self._thread.start()

    def submit(self, identifier: str, tensor: torch.Tensor, tag: Any = None) -> bool:
        """Queue a save of ``tensor``; False when the queue is full.

        ``tag`` goes back to ``put`` and ``done`` with the item (the identity
        the tensor was computed under).
        """
        with self._lock:
            if self._pending >= self.max_pending:
                return False
            self._pending += 1
        try:
            host, event = self._host_copy(tensor)
        except Exception as exc:  # raised into vLLM's forward pass, it would kill the worker
            self._handoff_failed(identifier, exc)
            return False
        self._queue.put((identifier, host, event, tag))
        return True

    @staticmethod
    def _host_copy(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """The tensor the thread saves, and the event its copy completes at."""
        if tensor.is_cpu:  # a flag: tensor.device builds an object per call
            return tensor, None
        if tensor.is_cuda:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            return host, event
        return tensor.to("cpu"), None  # other accelerators: a synchronous copy

    def _handoff_failed(self, identifier: str, exc: Exception) -> None:
        """Give the slot back."""
        self._release()
        self._warn_once("host copy", identifier, exc, "skipped", "saves_dropped")

    def _warn_once(
        self, step: str, identifier: str, exc: Exception, what: str, counter: str
    ) -> None:
        kind = (step, type(exc).__name__)
        if kind not in self._failures_logged:
            self._failures_logged.add(kind)
            logger.warning(
                "Saving encoder output %.24s %s, its %s failed "
                "(counted in %s, logged once per kind): %s",
                identifier,
                what,
                step,
                counter,
                exc,
            )

    def _release(self) -> None:
        with self._lock:
            self._pending -= 1
            self._lock.notify_all()

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            identifier, host, event, tag = item
            started = time.perf_counter()
            stored = False
            try:
                if event is not None:
                    event.synchronize()
                stored = self._put(identifier, host, tag)
            except Exception as exc:
                self._warn_once("put", identifier, exc, "not stored", "save_failures")
            finally:
                self._done(identifier, stored, time.perf_counter() - started, tag)
                self._release()

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def flush(self, timeout: float) -> bool:
        """Wait until every queued save finished; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self, timeout: float) -> None:
        """Wait for queued saves, then stop the thread: both within ``timeout``."""
        deadline = time.monotonic() + timeout
        self.flush(timeout)
        self._queue.put(None)
        self._thread.join(max(deadline - time.monotonic(), 0.0))
