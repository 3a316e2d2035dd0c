"""Bounded ``flock`` waits: a holder that keeps a lock (a process stopped while
holding it, a clear of a huge directory) costs its waiters a bounded delay
and an error they handle, never a thread stuck for good."""

from __future__ import annotations

import fcntl
import time


def flock_within(fd: int, seconds: float, what: str, *, shared: bool = False) -> None:
    """An exclusive (or ``shared``) flock on ``fd``, or TimeoutError (an
    OSError) naming ``what`` if a holder keeps it past ``seconds``."""
    deadline = time.monotonic() + seconds
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what} locked for over {seconds} s") from None
            time.sleep(0.001)
