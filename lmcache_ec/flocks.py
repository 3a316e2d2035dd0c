"""Bounded ``flock`` waits: a holder that keeps a lock (a process stopped while
holding it, a clear of a huge directory) costs its waiters a bounded delay
and an error they handle, never a thread stuck for good.

An ``flock`` belongs to the open file description, which a forked child
shares: a child that never uses the lock (a ``multiprocessing`` fork worker,
a daemon helper) would hold it for as long as it lives after the parent lets
go. Objects holding lock descriptors register with ``drop_locks_in_child``;
in every child forked through Python (``os.fork``) they close the
descriptors they inherited and make their thread locks anew.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import weakref
from typing import Protocol


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


class HoldsLocks(Protocol):
    def drop_inherited_locks(self) -> None:
        """In a forked child: close the lock descriptors inherited (never
        unlock them: the parent's locks are on the same descriptions) and make
        thread locks anew (another thread of the parent may have held one)."""


# Weak: registering keeps nothing alive; a collected holder has no descriptors left.
_holders: weakref.WeakSet[HoldsLocks] = weakref.WeakSet()


def drop_locks_in_child(holder: HoldsLocks) -> None:
    """Have ``holder.drop_inherited_locks()`` run in each child this process forks."""
    _holders.add(holder)


def close_inherited(fd: int) -> int:
    """Close ``fd`` (if open) in a forked child; -1, for the caller to keep."""
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
    return -1


def _after_fork_in_child() -> None:
    for holder in list(_holders):
        with contextlib.suppress(Exception):  # one holder's trouble leaves the others theirs
            holder.drop_inherited_locks()


os.register_at_fork(after_in_child=_after_fork_in_child)
