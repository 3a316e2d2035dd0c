"""Promotion of disk hits into the CPU tier, off the caller's path.

A disk hit is read into fresh memory, verified and handed to the caller as
is; copying it into the CPU pool too (a pool allocation, a second read, its
checksum) is work the reader need not wait for. ``Promoter`` does it on one
daemon thread, in a quiet moment: once no read is in progress and none has
started or ended for ``idle`` seconds, or once the oldest queued promotion
has waited ``max_wait``. A
burst of reads therefore does not compete with its own promotions for the
interpreter (on a small host that costs the reads more than the promotion
saves); they run in the gap after it, e.g. while the GPU computes.

Guarantees, so that a promotion is invisible except for speed:

- ``settle(key)`` promotes a queued ``key`` at once, in the calling thread
  (or waits for a running promotion of it): reads and ``ECCache.contains``
  call it, so after a disk hit the next read of the key is a CPU hit.
- ``cancel(key)`` drops a queued promotion of ``key`` (or waits for a running
  one): ``ECCache.remove`` calls it, so a removal is never undone by a
  promotion that was still queued.
- ``pending()`` counts queued and running promotions; ``ECCache.flush`` waits
  for them like for any other background write.
- ``run_pending()`` promotes what is queued at once, in the calling thread,
  for a caller that knows its quiet moment (``ECCache.promote_now``).
- Promotions are optional: beyond ``limit`` queued, or after ``close``, new
  ones are skipped (the entry stays where it was found, still readable).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from ..key import ECKey

logger = logging.getLogger(__name__)


class Promoter:
    def __init__(
        self,
        promote: Callable[..., None],
        idle: float = 0.02,
        max_wait: float = 1.0,
        limit: int = 1024,
    ) -> None:
        self._promote = promote
        self._idle = idle
        self._max_wait = max_wait
        self._limit = limit
        self._cond = threading.Condition()
        # key -> (time queued, promote's other arguments), oldest first
        self._queue: OrderedDict[ECKey, tuple[float, tuple[Any, ...]]] = OrderedDict()
        self._running: set[ECKey] = set()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._last_read = 0.0
        # One element per read in progress (a long copy-out is not a quiet
        # moment): deque appends and pops are atomic, so no lock on the read path.
        self._reads: deque[None] = deque()

    def reading(self) -> None:
        """Note that a read starts: queued promotions wait for a quiet moment."""
        self._reads.append(None)
        self._last_read = time.monotonic()

    def read_done(self) -> None:
        """Note that a read (its copy-out included) has ended."""
        self._reads.pop()
        self._last_read = time.monotonic()

    def reads_in_progress(self) -> int:
        return len(self._reads)

    def submit(self, key: ECKey, *args: Any) -> bool:
        """Queue ``promote(key, *args)``; False if skipped."""
        with self._cond:
            if (
                self._closed
                or key in self._queue
                or key in self._running
                or len(self._queue) >= self._limit
            ):
                return False
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="ec-promote", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # no thread now (a pids limit): skipped, tried next time
                    return False
                self._thread = thread
            self._queue[key] = (time.monotonic(), args)
            if len(self._queue) == 1:  # else the thread is already timing the queue
                self._cond.notify()
        return True

    def settle(self, key: ECKey) -> None:
        """Promote ``key`` now if it is queued; wait if it is being promoted."""
        if key in self._queue or key in self._running:  # rare: checked without the lock first
            self._take(key, run=True)

    def cancel(self, key: ECKey) -> None:
        """Drop a queued promotion of ``key``; wait if it is being promoted."""
        if key in self._queue or key in self._running:
            self._take(key, run=False)

    def pending(self) -> int:
        return len(self._queue) + len(self._running)

    def run_pending(self) -> int:
        """Promote every queued key now, in the calling thread; how many were run.

        For a caller that knows a quiet moment before the timer would find
        one: a vLLM worker right after answering a stage order, before the
        step that loads it (a promotion run by the timer would land in that
        step and compete with its forward pass for the interpreter).
        """
        done = 0
        while True:
            with self._cond:
                if self._closed or not self._queue:
                    return done
                key, (_, args) = self._queue.popitem(last=False)
                self._running.add(key)
            self._execute(key, args)
            done += 1

    def close(self, timeout: float = 5.0) -> None:
        """Skip queued promotions and stop the thread (bounded by ``timeout``)."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _take(self, key: ECKey, run: bool) -> None:
        with self._cond:
            while key in self._running:
                self._cond.wait()
            queued = self._queue.pop(key, None)
            if queued is None or not run:
                return
            self._running.add(key)
        self._execute(key, queued[1])

    def _execute(self, key: ECKey, args: tuple[Any, ...]) -> None:
        try:
            self._promote(key, *args)
        except Exception as exc:  # a failed promotion only costs speed
            logger.debug("Promotion of %s failed: %s", key, exc)
        finally:
            with self._cond:
                self._running.discard(key)
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                now = time.monotonic()
                key, (queued_at, args) = next(iter(self._queue.items()))
                quiet = 0.0 if self._reads else now - self._last_read
                waited = now - queued_at
                if quiet < self._idle and waited < self._max_wait:
                    self._cond.wait(min(self._idle - quiet, self._max_wait - waited))
                    continue
                del self._queue[key]
                self._running.add(key)
            self._execute(key, args)
