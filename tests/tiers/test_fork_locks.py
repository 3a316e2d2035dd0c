"""A child forked from a process that uses a directory tier holds none of its
locks (``flocks.drop_locks_in_child``): an ``flock`` belongs to the open file
description, which the child shares, so a child that never uses the cache (a
``multiprocessing`` fork worker, a daemon helper) would hold the node tier's
``.users`` or the size ledger for as long as it lives, and every engine start
or put on the node would wait for it, then fail.

- a node-tier user leaving last leaves ``.users`` free, whatever it forked;
- leaving never converts the lock it holds to exclusive: a child forked by C
  code (past Python's fork hooks) shares that description, and would keep
  ``.users`` exclusively;
- a ledger locked while the process forks is free once the parent lets go,
  and a child forked while another thread holds it can use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import select
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lmcache_ec.tiers.budget import DirectoryBudget
from lmcache_ec.tiers.disk_layout import DirectoryLayout
from lmcache_ec.tiers.node import USERS_FILE, NodeUsers

LIMIT = 1 << 20


@contextlib.contextmanager
def _child(fork: Callable[[], int] = os.fork, work: Callable[[], bytes] | None = None) -> Iterator:
    """A forked child that runs ``work`` (its answer written to a pipe), then
    waits, holding whatever it inherited, until the block ends; yields a read
    of its answer (None if none comes within a bound)."""
    answer_r, answer_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = fork()
    if pid == 0:
        try:
            os.write(answer_w, work() if work else b"ready")
            os.read(hold_r, 1)
        finally:
            os._exit(0)
    os.close(answer_w)
    os.close(hold_r)

    def answer() -> bytes | None:
        ready, _, _ = select.select([answer_r], [], [], 10)  # a bound on a hang, not a timing
        return os.read(answer_r, 64) if ready else None

    try:
        yield answer
    finally:
        os.close(hold_w)
        os.close(answer_r)
        os.kill(pid, signal.SIGKILL)  # also one stuck (on a lock it inherited held)
        os.waitpid(pid, 0)


def _free(path: str, mode: int = fcntl.LOCK_EX) -> bool:
    """Whether a new description of ``path`` can have the lock ``mode`` at once."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@pytest.fixture
def directory(tmp_path) -> Path:
    path = tmp_path / "node"
    path.mkdir(mode=0o700)
    return path


def test_a_user_leaving_last_leaves_users_free_whatever_it_forked(directory):
    users = NodeUsers(str(directory), clear=lambda: 0)
    with _child() as answer:
        assert answer() == b"ready"
        users.leave()
        assert _free(str(directory / USERS_FILE))  # an engine starting now waits for nobody


def _c_fork() -> int:
    """fork(2) called as C code calls it: Python's at-fork hooks do not run."""
    return ctypes.CDLL(None, use_errno=True).fork()


def test_leaving_converts_no_lock_a_child_forked_by_c_code_shares(directory):
    users = NodeUsers(str(directory), clear=lambda: 1)
    with _child(_c_fork) as answer:
        assert answer() == b"ready"
        assert users.leave() == 0  # the child holds the shared lock: not the last
        assert _free(str(directory / USERS_FILE), fcntl.LOCK_SH)  # never exclusively


@pytest.fixture
def budget(tmp_path) -> DirectoryBudget:
    entries = tmp_path / "entries"
    entries.mkdir(mode=0o700)
    return DirectoryBudget(DirectoryLayout(str(entries)), LIMIT, 0.0)


def test_a_ledger_locked_while_the_process_forks_is_free_once_it_lets_go(budget):
    ledger = budget._ledger_path()
    with contextlib.ExitStack() as children:
        with budget.locked():
            answer = children.enter_context(_child())
            assert answer() == b"ready"
        assert _free(ledger)  # the child lives on: every put of the node would wait


def test_a_child_forked_while_another_thread_holds_the_ledger_can_use_it(budget):
    budget.trim()  # the ledger made: 0 bytes
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with budget.locked():
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(30)
    with _child(work=lambda: str(budget.ledger()).encode()) as answer:
        release.set()
        holder.join(30)
        assert answer() == b"0"  # not stuck on the thread lock the holder had
