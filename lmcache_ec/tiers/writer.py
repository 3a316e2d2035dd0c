"""One thread that runs the disk tier's writes, handed over without waking anyone.

LMCache hands each disk write to its event loop (a self-pipe wake-up) and from
there to a pool of worker threads. On a small host each hop lets a background
thread take the interpreter while the caller's ``put`` is still running: the
caller waited 0.5-1 ms per put for writes that are meant to be background
work. Here ``submit`` only appends to a ``queue.SimpleQueue``: the caller keeps
the interpreter until it next blocks, and the writer runs then.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class BackgroundWriter:
    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._warned = False

    def submit(self, write: Callable[..., None], *args: Any) -> bool:
        """Queue ``write(*args)``; False once closed, or while no thread can be
        started (a pids limit): the caller cleans up, the next submit tries again."""
        with self._lock:
            if self._closed or not self._started():
                return False
            self._queue.put((write, args))
        return True

    def _started(self) -> bool:
        if self._thread is None:
            thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # "can't start new thread"
                if not self._warned:  # once, until a thread starts
                    logger.warning(
                        "%s: no thread to write with (%s): writes skipped", self._name, exc
                    )
                self._warned = True
                return False
            self._thread, self._warned = thread, False
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Finish queued writes (bounded by ``timeout``), then stop."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._queue.put(None)
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            write, args = item
            try:
                write(*args)
            except Exception as exc:  # each write handles its own errors; never stop
                logger.warning("Background write failed: %s", exc)
