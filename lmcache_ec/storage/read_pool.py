"""The reads of one ``get_many`` batch below the CPU tier, on several threads.

Those reads wait on files and sockets with the GIL released: on 2 cores a
disk ``get_many`` of eight went from 1.6-2.2x upstream's per-item loop on
one thread to 2.3-3.0x on two (docs/benchmarks.md). The caller's thread
takes part, so a batch of one costs no hand-off, and items are taken one at
a time from a shared index, so one slow item (a remote read) leaves no
thread idle while others remain.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class ReadPool:
    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def map(self, read: Callable[[Item], Result], items: Sequence[Item]) -> list[Result]:
        """``[read(item) for item in items]``, on up to ``threads`` threads, in order.

        The first exception raised by ``read`` is raised here once every
        thread has stopped; items not started by then are not read.
        """
        helpers = min(self.threads, len(items)) - 1
        executor = self._helpers() if helpers > 0 else None
        if executor is None:
            return [read(item) for item in items]
        results: list[Result | None] = [None] * len(items)
        taken = itertools.count()
        failed: list[BaseException] = []

        def work() -> None:
            while not failed:
                with self._lock:
                    index = next(taken)
                if index >= len(items):
                    return
                try:
                    results[index] = read(items[index])
                except BaseException as exc:
                    failed.append(exc)

        started: list[Future[None]] = []
        try:
            for _ in range(helpers):
                started.append(executor.submit(work))
        except RuntimeError:  # closed meanwhile: the caller reads the rest alone
            pass
        work()
        for future in started:
            # A helper still queued behind another caller's batch is not waited for.
            if not future.cancel():
                future.result()
        if failed:
            raise failed[0]
        return results  # type: ignore[return-value]

    def _helpers(self) -> ThreadPoolExecutor | None:
        if self._executor is None:
            with self._lock:
                if self._executor is None and not self._closed:
                    self._executor = ThreadPoolExecutor(
                        self.threads - 1, thread_name_prefix="ec-read"
                    )
        return self._executor

    def close(self) -> None:
        """Stop the helper threads once their reads end; later batches read on
        the caller's thread alone."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
