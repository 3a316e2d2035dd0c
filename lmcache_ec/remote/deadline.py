"""A bound on a whole blocking store call, not only on each socket operation.

Client socket timeouts bound each read of a socket: a server that sends a
value a byte at a time, each byte within the timeout, holds its caller for as
long as the value is long. ``Deadline.run`` runs the call on one of its
threads and waits for it at most ``seconds`` once it runs; a late call
raises ``LateAnswer`` and the store's connections are cut
(``RemoteStore.abort``), which ends the abandoned call at its next socket
read. A call that cannot be cut (S3) or that its client retries keeps one of
the threads until it ends. A call that waited ``seconds`` for a free thread
(every one busy) is given up as ``ReadersBusy``: the store is not at fault.

Its threads (``DaemonPool``) are daemon threads: a call nobody can cut never
holds the interpreter's exit, which joins every ``ThreadPoolExecutor`` thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from .store import StoreError

logger = logging.getLogger(__name__)
T = TypeVar("T")
GRACE = 0.5  # seconds a caller waits beyond ``remote_timeout`` for a whole call

_Job = tuple[Future, Callable[..., Any], tuple[Any, ...]]


class LateAnswer(StoreError):
    """The store did not finish answering within the call's bound."""


class ReadersBusy(StoreError):
    """Every thread was busy for the whole bound: the call never ran."""


class DaemonPool:
    """Up to ``threads`` daemon threads running submitted calls, in order.

    ``ThreadPoolExecutor``'s threads are joined when the interpreter exits:
    one stuck on a server that drips its answer would keep the process alive
    for ever. Threads start as calls find none idle.
    """

    def __init__(self, threads: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = threads
        self._started = 0
        self._closed = False
        self._name = name

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name} is shut down")
            self._jobs.put((future, fn, args))  # before the start: a new thread takes it first
            if not self._idle.acquire(blocking=False) and self._started < self._threads:
                name = f"{self._name}_{self._started}"
                try:
                    threading.Thread(target=self._work, name=name, daemon=True).start()
                    self._started += 1
                except RuntimeError as exc:  # no thread now (a pids limit)
                    if self._started == 0:  # none to take the call: it never runs
                        future.cancel()
                        raise ReadersBusy(f"no thread to run it: {exc}") from exc
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            _run(*job)
            del job  # an idle thread keeps no call's arguments (a frame's buffer)
            self._idle.release()

    def shutdown(self) -> None:
        """Cancel the calls not started; each thread ends after its current call."""
        with self._lock:
            self._closed = True
            threads = self._started
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in range(threads):
            self._jobs.put(None)


def _run(future: Future, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    if future.set_running_or_notify_cancel():  # False: cancelled while queued
        try:
            result = fn(*args)
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)


class Deadline:
    def __init__(self, seconds: float, abort: Callable[[], None], threads: int, name: str) -> None:
        self.seconds = seconds
        self._abort = abort
        self._pool = DaemonPool(threads, name)

    def run(
        self,
        call: Callable[..., T],
        *args: object,
        late: Callable[[Future[T]], None] | None = None,
    ) -> T:
        """``call(*args)``'s result or exception; ``LateAnswer`` after ``seconds``.

        ``late``: called with the call's future once an abandoned call ends
        (to release what it produced for nobody, or what it still reads).
        """
        started = threading.Event()

        def run() -> T:
            started.set()
            return call(*args)

        try:
            future = self._pool.submit(run)
        except ReadersBusy:
            raise
        except RuntimeError as exc:  # closed
            raise StoreError("the remote store is closed") from exc
        if not started.wait(self.seconds) and future.cancel():
            raise ReadersBusy(f"no free thread within {self.seconds:.1f} s")
        try:
            return future.result(self.seconds)
        except TimeoutError:
            if future.done():  # it ended meanwhile: its own answer or error
                return future.result()
        future.cancel()
        if late is not None:
            future.add_done_callback(late)
        try:
            self._abort()
        except Exception as exc:  # the call ends at its socket timeout instead
            logger.debug("Cutting the remote connections failed: %s", exc)
        raise LateAnswer(f"no whole answer within {self.seconds:.1f} s")

    def close(self) -> None:
        self._pool.shutdown()
