"""get_or_compute's flights in a process: a follower keeps its own bound, and
a leader's results reach its followers (and its own ``compute``) as soon as
each is known.

- A caller that joins a leader of its process waits without limit while that
  leader computes, but for another instance's output no longer than its own
  ``wait_s``: then it computes the entry itself (a duplicate computation,
  never a wrong tensor), whatever bound the leader waits under.
- A leader lands each entry once its result is known (a hit at once, an
  entry it computed once computed): nobody waits for the rest of its batch.
- A ``compute`` may ask for the other entries of its own batch (a stored hit,
  or one its call waits for from another instance): got or computed as usual,
  never "it would wait for itself".

Instances share one disk directory (claims beside it), as in
tests/test_get_or_compute.py.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tests.conftest import bit_equal, make_tensor
from tests.test_get_or_compute import (
    DTYPE,
    JOIN_S,
    NEVER_S,
    SHAPE,
    Computation,
    finished,
    in_thread,
    waiting_on_another,
)

SHORT_S = 0.2  # a follower's own bound: far below every leader's here
RETURNS_S = 10.0  # a caller still waiting after this waits for the other instance's holder


@pytest.fixture
def two(make_cache):
    """Two instances of one model sharing one disk directory."""
    return make_cache(model="test/flights", dtype=DTYPE), make_cache(
        model="test/flights", dtype=DTYPE
    )


def _held_elsewhere(instance, mm_hash: str) -> tuple[Computation, threading.Thread]:
    """``instance`` claims ``mm_hash`` and computes it until released (``.go.set()``)."""
    holding = Computation(seed=1, hold=True)
    thread, _ = in_thread(lambda: instance.get_or_compute(mm_hash, holding, wait_s=NEVER_S))
    assert holding.started.wait(JOIN_S)
    return holding, thread


def _still_running(thread: threading.Thread, seconds: float) -> bool:
    thread.join(seconds)
    return thread.is_alive()


@pytest.mark.timeout(60)
def test_a_follower_waits_for_another_instance_no_longer_than_its_own_bound(two):
    other, here = two
    holding, holder = _held_elsewhere(other, "k")
    # A leader of this process waits (NEVER_S) for the other instance's output.
    leader, led = in_thread(lambda: here.get_or_compute("k", Computation(seed=3), wait_s=NEVER_S))
    assert waiting_on_another(here)
    mine = Computation(seed=2)
    follower, followed = in_thread(lambda: here.get_or_compute("k", mine, wait_s=SHORT_S))
    # Without its own bound it would wait as long as the holder computes (until released).
    assert not _still_running(follower, RETURNS_S) and not holding.go.is_set()
    assert mine.calls == 1  # waited out: computed it itself
    assert bit_equal(followed[0], make_tensor(SHAPE, DTYPE, 2))
    # The leader then finds that output stored here and loads it, holder still busy.
    assert finished(leader) and not holding.go.is_set()
    assert bit_equal(led[0], make_tensor(SHAPE, DTYPE, 2))
    stats = here.stats.snapshot()["get_or_compute"]
    assert (stats["computes"], stats["waits"], stats["waits_loaded"]) == (1, 1, 1)
    holding.go.set()
    assert finished(holder)


@pytest.mark.timeout(60)
def test_a_follower_waits_for_a_compute_of_its_process_past_its_own_bound(two):
    here = two[1]
    computing = Computation(seed=4, hold=True)
    leader, led = in_thread(lambda: here.get_or_compute("k", computing, wait_s=NEVER_S))
    assert computing.started.wait(JOIN_S)
    mine = Computation(seed=5)
    follower, followed = in_thread(lambda: here.get_or_compute("k", mine, wait_s=0.01))
    assert _still_running(follower, 0.3)  # well past its bound: still waiting, not computing
    computing.go.set()
    assert finished(leader) and finished(follower)
    assert mine.calls == 0 and computing.calls == 1
    assert bit_equal(followed[0], make_tensor(SHAPE, DTYPE, 4))
    assert followed[0].data_ptr() != led[0].data_ptr()


@pytest.mark.timeout(60)
def test_an_entry_computed_in_a_batch_reaches_its_followers_before_the_batchs_wait(two):
    other, here = two
    holding, holder = _held_elsewhere(other, "theirs")
    go = threading.Event()
    started = threading.Event()

    def compute_many(hashes: list[str]) -> list[torch.Tensor]:
        started.set()
        assert go.wait(JOIN_S)
        return [make_tensor(SHAPE, DTYPE, 6) for _ in hashes]

    # The leader computes "mine", then waits (NEVER_S) for "theirs" from the other instance.
    leader, _ = in_thread(
        lambda: here.get_or_compute_many(["mine", "theirs"], compute_many, wait_s=NEVER_S)
    )
    assert started.wait(JOIN_S)
    late = Computation(seed=7)
    follower, followed = in_thread(lambda: here.get_or_compute("mine", late, wait_s=NEVER_S))
    time.sleep(0.1)  # it joins the leader's flight of "mine"
    go.set()
    # Landed once computed: not kept until the leader's wait for "theirs" ends.
    assert not _still_running(follower, RETURNS_S) and not holding.go.is_set()
    assert late.calls == 0
    assert bit_equal(followed[0], make_tensor(SHAPE, DTYPE, 6))
    holding.go.set()
    assert finished(holder) and finished(leader)


@pytest.mark.timeout(30)
def test_a_compute_may_ask_for_a_stored_entry_of_its_own_batch(two):
    here = two[0]
    stored = make_tensor(SHAPE, DTYPE, 2)
    assert here.put("stored", stored)
    calls: list[list[str]] = []

    def compute_many(hashes: list[str]) -> list[torch.Tensor]:
        calls.append(hashes)
        dep = here.get_or_compute("stored", lambda: make_tensor(SHAPE, DTYPE, 9))
        return [dep + 1 for _ in hashes]

    out = here.get_or_compute_many(["new", "stored"], compute_many)
    assert calls == [["new"]]
    assert bit_equal(out[0], stored + 1) and bit_equal(out[1], stored)
    assert here.stats.snapshot()["get_or_compute"]["computes"] == 1


@pytest.mark.timeout(60)
def test_a_compute_may_ask_for_an_entry_its_batch_waits_for_from_another_instance(two):
    other, here = two
    holding, holder = _held_elsewhere(other, "theirs")
    inner = Computation(seed=8)

    def compute_many(hashes: list[str]) -> list[torch.Tensor]:
        # "theirs" is the other instance's: this call waits for it (its own bound).
        dep = here.get_or_compute("theirs", inner, wait_s=SHORT_S)
        return [dep.clone() for _ in hashes]

    thread, out = in_thread(
        lambda: here.get_or_compute_many(["mine", "theirs"], compute_many, wait_s=NEVER_S)
    )
    assert finished(thread) and not holding.go.is_set()
    assert not isinstance(out[0], BaseException), out[0]
    expected = make_tensor(SHAPE, DTYPE, 8)
    assert inner.calls == 1  # its wait ran out: computed it; the batch then loaded it
    assert bit_equal(out[0][0], expected) and bit_equal(out[0][1], expected)
    holding.go.set()
    assert finished(holder)
