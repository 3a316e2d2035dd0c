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

    def submit(self, write: Callable[..., None], *args: Any) -> bool:
        """Queue ``write(*args)``; False once closed (the caller cleans up)."""
        with self._lock:
            if self._closed:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.put((write, args))
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
