"""Deadline: a whole store call within its bound, without blaming the store
for what is not its fault (a call that ended as its wait timed out; threads
of this process all busy)."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from lmcache_ec.remote.deadline import Deadline, LateAnswer, ReadersBusy


class _EndsAsTheWaitTimesOut(cf.Future):
    """A future whose call ends right after a wait for it timed out."""

    def __init__(self, ends: threading.Event) -> None:
        super().__init__()
        self._ends = ends

    def result(self, timeout=None):
        try:
            return super().result(timeout)
        except TimeoutError:
            self._ends.set()
            super().exception()  # it ended: before the caller looks again
            raise


def test_a_call_ending_as_its_wait_times_out_gives_its_answer():
    ends, aborted = threading.Event(), []
    deadline = Deadline(0.05, abort=lambda: aborted.append(1), threads=1, name="t")
    inner = cf.ThreadPoolExecutor(1)

    def submit(fn):
        future = _EndsAsTheWaitTimesOut(ends)
        inner.submit(lambda: future.set_result(fn()))
        return future

    deadline._pool.submit = submit
    try:
        answer = deadline.run(lambda: ends.wait(5) and "the frame")
    finally:
        inner.shutdown()
        deadline.close()
    assert answer == "the frame"  # not a LateAnswer: nothing to release, no one to blame
    assert aborted == []


def test_a_call_that_finds_every_thread_busy_is_not_the_stores_fault():
    aborted: list[int] = []
    deadline = Deadline(0.1, abort=lambda: aborted.append(1), threads=1, name="t")
    release = threading.Event()
    deadline._pool.submit(release.wait, 5)  # the only thread, busy
    try:
        with pytest.raises(ReadersBusy):
            deadline.run(lambda: "never run")
        assert aborted == []  # the store's connections are left alone
    finally:
        release.set()
        deadline.close()


def test_a_late_call_is_cut_and_what_it_produces_is_released():
    released, aborted = threading.Event(), threading.Event()
    finish = threading.Event()
    deadline = Deadline(0.05, abort=aborted.set, threads=1, name="t")
    try:
        with pytest.raises(LateAnswer):
            deadline.run(lambda: finish.wait(5) and "a buffer", late=lambda f: released.set())
        assert aborted.is_set()
        finish.set()
        assert released.wait(5)  # the abandoned call's result reaches ``late``
    finally:
        deadline.close()
