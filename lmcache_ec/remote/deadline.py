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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from .store import StoreError

logger = logging.getLogger(__name__)
T = TypeVar("T")
GRACE = 0.5  # seconds a caller waits beyond ``remote_timeout`` for a whole call


class LateAnswer(StoreError):
    """The store did not finish answering within the call's bound."""


class ReadersBusy(StoreError):
    """Every thread was busy for the whole bound: the call never ran."""


class Deadline:
    def __init__(self, seconds: float, abort: Callable[[], None], threads: int, name: str) -> None:
        self.seconds = seconds
        self._abort = abort
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    def run(
        self,
        call: Callable[..., T],
        *args: object,
        late: Callable[[Future[T]], None] | None = None,
    ) -> T:
        """``call(*args)``'s result or exception; ``LateAnswer`` after ``seconds``.

        ``late``: called with the call's future once an abandoned call ends
        (to release what it produced for nobody).
        """
        started = threading.Event()

        def run() -> T:
            started.set()
            return call(*args)

        try:
            future = self._pool.submit(run)
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
        self._pool.shutdown(wait=False, cancel_futures=True)
