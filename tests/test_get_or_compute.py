"""ECCache.get_or_compute: one computation per entry, in a process and across instances.

Instances here share a disk directory (claims beside it, ``DirectoryClaims``);
two caches of one process on one directory are two instances (each has its
own claim owner). A dead holder is a real process, killed holding its claim.
The remote stores (Redis, S3) are in tests/remote/test_get_or_compute.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from lmcache_ec import ECCache
from lmcache_ec.claims import ClaimAgent, DirectoryClaims, claims_dir_for
from lmcache_ec.storage import single_flight
from tests.conftest import bit_equal, make_tensor

SHAPE = (16, 64)
DTYPE = torch.bfloat16
NEVER_S = 600.0  # a bound no test reaches: finishing proves it was not waited out
JOIN_S = 60.0  # a thread still running after this is stuck


@pytest.fixture
def open_cache(make_cache):
    """``open_cache(config=None)``: a new instance (``local_config`` by default)."""
    return functools.partial(make_cache, model="test/get-or-compute", dtype=DTYPE)


@pytest.fixture
def two(open_cache):
    """Two instances sharing one disk directory."""
    return open_cache(), open_cache()


class Computation:
    """A ``compute`` that counts its calls, and can be held until released."""

    def __init__(self, seed: int = 0, hold: bool = False) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.go = threading.Event()
        if not hold:
            self.go.set()
        self.seed = seed
        self._lock = threading.Lock()

    def __call__(self) -> torch.Tensor:
        with self._lock:
            self.calls += 1
        self.started.set()
        assert self.go.wait(JOIN_S)
        return make_tensor(SHAPE, DTYPE, self.seed)


def in_thread(call) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def waiting_on_another(cache: ECCache, count: int = 1) -> bool:
    """Whether ``cache`` met another instance's claim ``count`` times (within JOIN_S)."""
    deadline = time.monotonic() + JOIN_S
    while cache.stats.snapshot()["get_or_compute"]["waits"] < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def finished(thread: threading.Thread) -> bool:
    thread.join(JOIN_S)
    return not thread.is_alive()


def test_threads_asking_for_one_new_key_share_one_compute(cache):
    compute = Computation(hold=True)
    barrier = threading.Barrier(8)

    def ask():
        barrier.wait()
        return cache.get_or_compute("new-image", compute)

    threads = [in_thread(ask) for _ in range(8)]
    assert compute.started.wait(JOIN_S)
    time.sleep(0.2)  # the others, past the barrier too, ask while it computes
    compute.go.set()
    results = [out for thread, out in threads if finished(thread) for out in out]
    assert compute.calls == 1
    expected = make_tensor(SHAPE, DTYPE, 0)
    assert len(results) == 8 and all(bit_equal(r, expected) for r in results)
    assert len({r.data_ptr() for r in results}) == 8  # each caller its own tensor
    assert bit_equal(cache.get("new-image"), expected)
    assert cache.stats.snapshot()["get_or_compute"]["computes"] == 1


def test_a_stored_entry_is_returned_without_computing(cache):
    stored = make_tensor(SHAPE, DTYPE, 3)
    assert cache.put("present", stored)
    compute = Computation()
    assert bit_equal(cache.get_or_compute("present", compute), stored)
    assert compute.calls == 0


def test_an_instance_waits_for_anothers_computation_and_loads_it(two):
    first, second = two
    holding = Computation(seed=1, hold=True)
    holder, held_out = in_thread(lambda: first.get_or_compute("shared", holding, wait_s=NEVER_S))
    assert holding.started.wait(JOIN_S)  # first holds the claim, computing
    waiting = Computation(seed=2)
    waiter, waited_out = in_thread(lambda: second.get_or_compute("shared", waiting, wait_s=NEVER_S))
    assert waiting_on_another(second)
    holding.go.set()
    assert finished(holder) and finished(waiter)
    assert waiting.calls == 0  # loaded the holder's output
    assert bit_equal(waited_out[0], held_out[0])
    assert bit_equal(waited_out[0], make_tensor(SHAPE, DTYPE, 1))
    stats = second.stats.snapshot()["get_or_compute"]
    assert (stats["waits"], stats["waits_loaded"], stats["computes"]) == (1, 1, 0)


_HOLD_A_CLAIM = """
import sys, time
from lmcache_ec.claims import DirectoryClaims
assert DirectoryClaims(sys.argv[1]).claim(sys.argv[2], 600)
print("claimed", flush=True)
time.sleep(600)
"""


def claimed_by_a_killed_process(claims_dir: str, name: str) -> None:
    """A process claims ``name`` for 600 s and is killed holding it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_A_CLAIM, claims_dir, name],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "claimed"
    finally:
        holder.kill()
        holder.wait(30)
        holder.stdout.close()


def test_a_killed_holder_delays_others_at_most_the_bound(cache, disk_dir):
    name = cache.key("orphaned").storage_name
    claimed_by_a_killed_process(claims_dir_for(str(disk_dir)), name)
    compute = Computation(seed=4)
    thread, out = in_thread(lambda: cache.get_or_compute("orphaned", compute, wait_s=0.3))
    assert finished(thread)
    assert compute.calls == 1 and bit_equal(out[0], make_tensor(SHAPE, DTYPE, 4))
    stats = cache.stats.snapshot()["get_or_compute"]
    assert (stats["waits"], stats["waits_loaded"]) == (1, 0)


def test_a_compute_that_raises_raises_in_its_caller_only_and_releases_its_claim(two, disk_dir):
    first, second = two

    class Broken(RuntimeError):
        pass

    failing = Computation(hold=True)
    failing_seed = failing.__call__

    def fail() -> torch.Tensor:
        failing_seed()
        raise Broken("encoder failed")

    # One in-process follower of the failing leader, one instance waiting on its claim.
    holder, held_out = in_thread(lambda: first.get_or_compute("fragile", fail, wait_s=NEVER_S))
    assert failing.started.wait(JOIN_S)
    follower_compute = Computation(seed=5)
    follower, follower_out = in_thread(
        lambda: first.get_or_compute("fragile", follower_compute, wait_s=NEVER_S)
    )
    other_compute = Computation(seed=6)
    other, other_out = in_thread(
        lambda: second.get_or_compute("fragile", other_compute, wait_s=NEVER_S)
    )
    assert waiting_on_another(second)
    time.sleep(0.1)  # the follower, started first, has joined the flight too
    failing.go.set()
    assert finished(holder) and finished(follower) and finished(other)
    assert isinstance(held_out[0], Broken)
    # The waiters asked again: one computed, the other loaded its result.
    assert follower_compute.calls + other_compute.calls == 1
    assert isinstance(follower_out[0], torch.Tensor) and isinstance(other_out[0], torch.Tensor)
    assert bit_equal(follower_out[0], other_out[0])
    name = first.key("fragile").storage_name
    first.close()
    second.close()  # claims still held are withdrawn at close
    assert DirectoryClaims(claims_dir_for(str(disk_dir))).claim(name, 60)


@pytest.mark.parametrize(
    "result, error, words",
    [
        ("not a tensor", TypeError, "torch.Tensor"),
        (make_tensor(SHAPE, torch.float32), ValueError, "dtype float32"),
        (make_tensor(SHAPE, DTYPE).flatten(), ValueError, "2-D"),
        (torch.empty(0, 64, dtype=DTYPE), ValueError, "non-empty"),
    ],
    ids=["non-tensor", "wrong-dtype", "wrong-rank", "empty"],
)
def test_a_hostile_result_is_a_clear_error_and_nothing_is_stored(two, result, error, words):
    first, second = two
    with pytest.raises(error, match=words):
        first.get_or_compute("hostile", lambda: result, wait_s=NEVER_S)
    assert first.contains("hostile") is None and second.contains("hostile") is None
    assert first.stats.snapshot()["get_or_compute"]["rejected"] == 1
    # Its claim was withdrawn: another instance computes at once.
    good = Computation(seed=7)
    thread, out = in_thread(lambda: second.get_or_compute("hostile", good, wait_s=NEVER_S))
    assert finished(thread) and good.calls == 1
    assert bit_equal(out[0], make_tensor(SHAPE, DTYPE, 7))


def test_a_batch_with_a_hostile_member_stores_none_of_it(two):
    cache = two[0]
    with pytest.raises(ValueError, match="dtype float32"):
        cache.get_or_compute_many(
            ["fine", "bad"],
            lambda hashes: [make_tensor(SHAPE, DTYPE), make_tensor(SHAPE, torch.float32)],
        )
    with pytest.raises(ValueError, match="returned 1 tensors for 2"):
        cache.get_or_compute_many(["fine", "bad"], lambda hashes: [make_tensor(SHAPE, DTYPE)])
    assert cache.contains("fine") is None and cache.contains("bad") is None


def test_the_batched_form_computes_only_what_no_tier_holds_in_one_call(cache):
    assert cache.put("b", make_tensor(SHAPE, DTYPE, 20))
    calls: list[list[str]] = []

    def compute(hashes: list[str]) -> list[torch.Tensor]:
        calls.append(hashes)
        return [make_tensor(SHAPE, DTYPE, 30 + ord(h)) for h in hashes]

    out = cache.get_or_compute_many(["a", "b", "c", "a"], compute)
    assert calls == [["a", "c"]]
    expected = [30 + ord("a"), 20, 30 + ord("c"), 30 + ord("a")]
    assert all(
        bit_equal(t, make_tensor(SHAPE, DTYPE, s)) for t, s in zip(out, expected, strict=True)
    )
    assert cache.get_or_compute_many(["c", "a"], compute)[0] is not None and len(calls) == 1


@pytest.mark.parametrize("stored", [False, True], ids=["computed", "stored"])
def test_a_hash_asked_twice_in_a_batch_gets_two_tensors(cache, stored):
    if stored:
        assert cache.put("twice", make_tensor(SHAPE, DTYPE, 7))
    out = cache.get_or_compute_many(
        ["twice", "twice"], lambda hashes: [make_tensor(SHAPE, DTYPE, 7) for _ in hashes]
    )
    out[0].zero_()  # the caller's own tensor, as from get_many
    assert bit_equal(out[1], make_tensor(SHAPE, DTYPE, 7))


def test_a_bad_hash_in_a_batch_leaves_no_flight_behind(cache):
    good = Computation(seed=8)
    for bad in ("", 123):
        with pytest.raises((ValueError, TypeError)):
            cache.get_or_compute_many(["good", bad], lambda hashes: [good() for _ in hashes])
    assert good.calls == 0
    thread, out = in_thread(lambda: cache.get_or_compute("good", good))
    assert finished(thread), "a flight of the failed call was never landed"
    assert bit_equal(out[0], make_tensor(SHAPE, DTYPE, 8))
    assert bit_equal(cache.get_or_compute("good", good), make_tensor(SHAPE, DTYPE, 8))


def test_followers_get_the_computed_tensor_whatever_the_leaders_caller_does_with_its_own(
    cache,
):
    # The leader's caller changes the tensor it got at once; its followers,
    # woken by the same landing, must still get what was computed.
    for trial in range(20):
        compute = Computation(seed=trial, hold=True)
        name = f"shared-{trial}"

        def lead(name=name, compute=compute):
            cache.get_or_compute(name, compute).zero_()

        def follow(name=name, compute=compute):
            return cache.get_or_compute(name, compute)

        leader, _ = in_thread(lead)
        assert compute.started.wait(JOIN_S)
        followers = [in_thread(follow), in_thread(follow)]
        time.sleep(0.02)  # the followers join the flight (one that comes late loads it)
        compute.go.set()
        assert finished(leader)
        expected = make_tensor(SHAPE, DTYPE, trial)
        for thread, out in followers:
            assert finished(thread)
            assert bit_equal(out[0], expected), f"trial {trial}: a follower got a changed tensor"
        assert compute.calls == 1


def test_the_batched_form_waits_for_what_another_instance_holds(two):
    first, second = two
    holding = Computation(seed=40, hold=True)
    holder, _ = in_thread(lambda: first.get_or_compute("x", holding, wait_s=NEVER_S))
    assert holding.started.wait(JOIN_S)
    calls: list[list[str]] = []

    def compute(hashes: list[str]) -> list[torch.Tensor]:
        calls.append(hashes)
        return [make_tensor(SHAPE, DTYPE, 41) for _ in hashes]

    batch, out = in_thread(lambda: second.get_or_compute_many(["x", "y"], compute, wait_s=NEVER_S))
    assert waiting_on_another(second)
    holding.go.set()
    assert finished(holder) and finished(batch)
    assert calls == [["y"]]  # "x" loaded from the instance that claimed it
    assert bit_equal(out[0][0], make_tensor(SHAPE, DTYPE, 40))
    assert bit_equal(out[0][1], make_tensor(SHAPE, DTYPE, 41))


def claim_owner(cache: ECCache, claims_dir: str) -> str:
    """Who ``cache``'s claims say holds them: read from one it holds while computing."""
    probe = f"owner-probe-{id(cache)}"
    path = os.path.join(claims_dir, cache.key(probe).storage_name + ".claim")
    owners: list[str] = []

    def compute() -> torch.Tensor:
        with open(path) as record:
            owners.append(json.load(record)["owner"])
        return make_tensor(SHAPE, DTYPE)

    cache.get_or_compute(probe, compute, wait_s=NEVER_S)
    return owners[0]


def test_batches_in_opposite_orders_compute_what_they_won_before_waiting(two, disk_dir):
    first, second = two
    claims_dir = claims_dir_for(str(disk_dir))
    # As if each batch had won the first claim it asked for and lost the other (one
    # claim per name on directories and S3): first holds "x", second holds "y".
    for cache, mm_hash in ((first, "x"), (second, "y")):
        holder = DirectoryClaims(claims_dir, owner=claim_owner(cache, claims_dir))
        assert holder.claim(cache.key(mm_hash).storage_name, NEVER_S)
    calls: dict[str, list[list[str]]] = {"first": [], "second": []}
    go = threading.Event()  # first's compute is held until second met its claim

    def compute_for(tag: str, seeds: dict[str, int]):
        def compute(hashes: list[str]) -> list[torch.Tensor]:
            calls[tag].append(hashes)
            if tag == "first":
                assert go.wait(JOIN_S)
            return [make_tensor(SHAPE, DTYPE, seeds[h]) for h in hashes]

        return compute

    # Each also computes the other's entry, if it ever gets to: it then differs.
    a, a_out = in_thread(
        lambda: first.get_or_compute_many(
            ["x", "y"], compute_for("first", {"x": 50, "y": 51}), wait_s=NEVER_S
        )
    )
    assert waiting_on_another(first)  # "y" is second's
    b, b_out = in_thread(
        lambda: second.get_or_compute_many(
            ["y", "x"], compute_for("second", {"x": 52, "y": 53}), wait_s=NEVER_S
        )
    )
    assert waiting_on_another(second)  # "x" is first's, not computed yet
    go.set()
    # Waiting for the other's entry while holding its own claim uncomputed, each
    # would wait for the other until wait_s ran out (NEVER_S: a stuck thread).
    assert finished(a) and finished(b), "the instances waited on each other"
    assert calls == {"first": [["x"]], "second": [["y"]]}  # each entry computed once
    x, y = make_tensor(SHAPE, DTYPE, 50), make_tensor(SHAPE, DTYPE, 53)
    assert bit_equal(a_out[0][0], x) and bit_equal(a_out[0][1], y)
    assert bit_equal(b_out[0][0], y) and bit_equal(b_out[0][1], x)
    for cache in two:
        stats = cache.stats.snapshot()["get_or_compute"]
        assert (stats["computes"], stats["waits"], stats["waits_loaded"]) == (2, 1, 1)


def test_a_result_computed_across_new_weights_is_returned_but_never_stored(open_cache):
    cache = open_cache()
    old = cache.identity
    computed = make_tensor(SHAPE, DTYPE, 5)

    def compute_during_a_weight_update() -> torch.Tensor:
        cache.set_identity(dataclasses.replace(old, weights="new-weights"))  # another thread's
        return computed

    assert bit_equal(cache.get_or_compute("image", compute_during_a_weight_update), computed)
    assert cache.get("image") is None  # not under the new weights
    cache.set_identity(old)
    assert cache.get("image") is None  # nor the old: which weights computed it is unknown
    assert cache.stats.snapshot()["get_or_compute"]["not_stored"] == 1


def test_bad_arguments_are_refused(cache):
    with pytest.raises(ValueError, match="wait_s"):
        cache.get_or_compute("k", lambda: make_tensor(SHAPE, DTYPE), wait_s=-1)
    with pytest.raises(TypeError, match="sequence of tensors"):
        cache.get_or_compute_many(["k"], lambda hashes: make_tensor(SHAPE, DTYPE))
    with pytest.raises(TypeError, match="not one string"):
        cache.get_or_compute_many("ab", lambda hashes: [make_tensor(SHAPE, DTYPE)] * 2)


def test_followers_get_tensors_outside_the_leaders_autograd_graph(cache):
    compute = Computation(seed=3, hold=True)

    def lead():
        weights = torch.ones((), requires_grad=True)  # a compute that kept its graph
        return cache.get_or_compute("graph", lambda: compute() * weights)

    leader, _ = in_thread(lead)
    assert compute.started.wait(JOIN_S)
    follower, out = in_thread(lambda: cache.get_or_compute("graph", compute))
    time.sleep(0.02)  # the follower joins the flight
    compute.go.set()
    assert finished(leader) and finished(follower)
    assert out[0].grad_fn is None and not out[0].requires_grad
    assert bit_equal(out[0], make_tensor(SHAPE, DTYPE, 3))


@pytest.mark.timeout(20)  # a compute waiting for itself hangs: fail instead
def test_a_compute_asking_for_its_own_key_is_a_clear_error_not_a_stall(two):
    first, second = two
    inner: list[BaseException] = []

    def compute() -> torch.Tensor:
        try:
            return first.get_or_compute("self", lambda: make_tensor(SHAPE, DTYPE, 8))
        except RuntimeError as exc:
            inner.append(exc)
            raise

    with pytest.raises(RuntimeError, match="would wait for itself"):
        first.get_or_compute("self", compute, wait_s=NEVER_S)
    assert len(inner) == 1 and "'self'" in str(inner[0])
    assert first.contains("self") is None
    # Failed as any raising compute: its claim withdrawn, another instance computes at once.
    good = Computation(seed=9)
    thread, out = in_thread(lambda: second.get_or_compute("self", good, wait_s=NEVER_S))
    assert finished(thread) and good.calls == 1
    assert bit_equal(out[0], make_tensor(SHAPE, DTYPE, 9))


@pytest.mark.timeout(20)
def test_a_compute_may_ask_for_other_keys_but_not_its_own_in_a_batch(cache):
    def compute_outer() -> torch.Tensor:
        inner = cache.get_or_compute("inner", lambda: make_tensor(SHAPE, DTYPE, 10))
        return inner.clone()

    assert bit_equal(cache.get_or_compute("outer", compute_outer), make_tensor(SHAPE, DTYPE, 10))
    assert bit_equal(cache.get("inner"), make_tensor(SHAPE, DTYPE, 10))

    def compute_many(hashes: list[str]) -> list[torch.Tensor]:
        # "other" is joined before "a" is met: left to whoever asks next.
        cache.get_or_compute_many(["other", "a"], lambda h: [make_tensor(SHAPE, DTYPE)] * len(h))
        raise AssertionError("unreachable: the inner call raises")

    with pytest.raises(RuntimeError, match="would wait for itself"):
        cache.get_or_compute_many(["a"], compute_many)
    assert cache.contains("a") is None and cache.contains("other") is None
    later = Computation(seed=11)
    assert bit_equal(cache.get_or_compute("other", later), make_tensor(SHAPE, DTYPE, 11))
    assert later.calls == 1


def test_a_holder_keeps_its_claim_until_its_output_reached_the_shared_tier(two):
    first, second = two
    written = threading.Event()
    # The holder's disk writes queue behind this one: its output stays in its CPU tier.
    assert first._storage.disk._writer.submit(written.wait, JOIN_S)
    try:
        holding = Computation(seed=12, hold=True)
        holder, held_out = in_thread(
            lambda: first.get_or_compute("slow-write", holding, wait_s=NEVER_S)
        )
        assert holding.started.wait(JOIN_S)
        waiting = Computation(seed=13)
        waiter, waited_out = in_thread(
            lambda: second.get_or_compute("slow-write", waiting, wait_s=NEVER_S)
        )
        assert waiting_on_another(second)
        holding.go.set()
        assert finished(holder)
        assert first.contains("slow-write") == "cpu" and second.contains("slow-write") is None
        # A claim withdrawn now would be the waiter's at its next look (25 ms apart at
        # most): it would compute. Kept until the write lands, the waiter loads instead.
        waiter.join(0.5)
    finally:
        written.set()
    assert finished(waiter)
    assert waiting.calls == 0
    assert bit_equal(waited_out[0], held_out[0])
    assert second.stats.snapshot()["get_or_compute"]["waits_loaded"] == 1


def test_followers_whose_copy_cannot_be_made_ask_again_and_never_hang(cache, monkeypatch):
    # The followers' copy fails (out of memory, say): they ask again, and so
    # does anyone later; no flight is left in the table.
    compute = Computation(seed=9, hold=True)
    leader, led = in_thread(
        lambda: cache.get_or_compute_many(["a", "b"], lambda h: [compute() for _ in h])
    )
    assert compute.started.wait(JOIN_S)
    follower, followed = in_thread(lambda: cache.get_or_compute("a", compute))
    time.sleep(0.05)  # the follower joins the flight of "a"

    def no_memory(tensor, *args, **kwargs):
        raise torch.OutOfMemoryError("no memory for the followers' copy")

    monkeypatch.setattr(torch, "clone", no_memory)
    compute.go.set()
    assert finished(leader) and finished(follower), "a follower waits for ever"
    monkeypatch.undo()
    assert bit_equal(followed[0], make_tensor(SHAPE, DTYPE, 9))  # read again: stored
    later, out = in_thread(lambda: cache.get_or_compute("b", compute))
    assert finished(later) and bit_equal(out[0], make_tensor(SHAPE, DTYPE, 9))
    assert not isinstance(led[0], BaseException)


def pause_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


class TakeOver:
    """The ``compute`` of waiters: the first call (the one that took the claim
    over) is held until ``go``; any later one (a waiter that gave up) returns
    at once, so each is counted."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.calls = 0
        self.started = threading.Event()
        self.go = threading.Event()
        self._lock = threading.Lock()

    def __call__(self) -> torch.Tensor:
        with self._lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            self.started.set()
            assert self.go.wait(JOIN_S)
        return make_tensor(SHAPE, DTYPE, self.seed)


@pytest.mark.parametrize("store", ["directory", "redis"])
@pytest.mark.parametrize("holder_ends", ["claim-expires", "compute-raises"])
def test_waiters_whose_holder_failed_wait_for_the_one_that_took_its_claim_over(
    request, open_cache, store, holder_ends
):
    """A holder's claim ends without an output (it expired: the holder died or
    overran it; or its compute raised): one waiter takes it over and computes,
    past the others' own bound. The others wait for that one and load its
    output (library.md: "the others wait for that one") instead of all
    computing when their bound passes."""
    wait_s = 1.0
    if store == "redis":
        from tests.remote.conftest import remote_config

        caches = [open_cache(remote_config(request.getfixturevalue("redis_url"))) for _ in range(4)]
    else:
        caches = [open_cache() for _ in range(4)]
    holder_cache, waiters = caches[0], caches[1:]
    holding = Computation(seed=60, hold=True)

    def hold() -> torch.Tensor:
        tensor = holding()
        if holder_ends == "compute-raises":
            raise RuntimeError("encoder failed")
        return tensor

    holder, _ = in_thread(lambda: holder_cache.get_or_compute("orphan", hold, wait_s=wait_s))
    assert holding.started.wait(JOIN_S)
    takeover = TakeOver(seed=61)
    threads = [
        in_thread(lambda c=cache: c.get_or_compute("orphan", takeover, wait_s=wait_s))
        for cache in waiters
    ]
    assert all(waiting_on_another(cache) for cache in waiters)
    now = time.monotonic()
    if holder_ends == "compute-raises":
        # Late in the waits (a takeover early in them ends before they do): it
        # raises, its claim is withdrawn at once.
        pause_until(now + wait_s / 2)
        holding.go.set()
    assert takeover.started.wait(JOIN_S)  # one waiter took the claim over
    pause_until(now + wait_s + 0.2)  # every waiter's own bound has passed
    takeover.go.set()
    assert all(finished(thread) for thread, _ in threads)
    holding.go.set()
    assert finished(holder)
    assert takeover.calls == 1, "waiters computed when their bound passed"
    assert all(bit_equal(out[0], make_tensor(SHAPE, DTYPE, 61)) for _, out in threads)
    loaded = sum(c.stats.snapshot()["get_or_compute"]["waits_loaded"] for c in waiters)
    assert loaded == 2


def test_a_claim_renewed_for_ever_delays_a_waiter_at_most_twice_its_bound(cache, disk_dir):
    """A holder that keeps renewing its claim (never storing an output): the
    waiter's wait is extended once (the claim is still held at its bound), then
    it computes — never waits for ever."""
    name = cache.key("renewed").storage_name
    holder = DirectoryClaims(claims_dir_for(str(disk_dir)))
    assert holder.claim(name, 0.2)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(0.02):
            holder.claim(name, 0.2)

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        compute = Computation(seed=62)
        thread, out = in_thread(lambda: cache.get_or_compute("renewed", compute, wait_s=0.2))
        thread.join(10.0)  # ~0.4 s: its bound, once extended
        assert not thread.is_alive(), "the waiter waits as long as the claim is renewed"
    finally:
        stop.set()
        renewer.join(JOIN_S)
    assert compute.calls == 1 and bit_equal(out[0], make_tensor(SHAPE, DTYPE, 62))


def test_a_forked_child_gets_a_clear_error_from_the_parents_cache_not_a_wait(cache):
    """A process forks while one of its threads computes an entry (a DataLoader
    or gunicorn worker): in the child, the parent's cache raises at once. Its
    threads stayed in the parent, so the child waited for ever on that
    computation, and its writes never landed."""
    compute = Computation(seed=7, hold=True)
    thread, _ = in_thread(lambda: cache.get_or_compute("in-flight", compute))
    assert compute.started.wait(JOIN_S)
    answer_r, answer_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            try:
                cache.get_or_compute("in-flight", Computation(seed=7), wait_s=1.0)
                said = b"returned"
            except RuntimeError as exc:
                said = str(exc).encode()[:200]
            os.write(answer_w, said)
        finally:
            os._exit(0)
    os.close(answer_w)
    try:
        ready, _, _ = select.select([answer_r], [], [], JOIN_S)  # a bound on a hang
        said = os.read(answer_r, 256) if ready else b"(no answer: it waits)"
    finally:
        os.close(answer_r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        compute.go.set()
    assert b"opened before this process forked" in said
    assert finished(thread)
    assert bit_equal(cache.get("in-flight"), make_tensor(SHAPE, DTYPE, 7))  # the parent's works


def test_a_batch_interrupted_while_joining_leaves_no_flight_behind(cache, monkeypatch):
    """Ctrl-C caught in a notebook while a large batch joins its flights: the
    ones it already leads are landed, so a later call of those keys computes
    (it waited for ever on a leader that was gone)."""
    join = single_flight.LocalFlights.join
    joined: list[str] = []

    def interrupted_join(flights, name):
        if len(joined) == 2:
            raise KeyboardInterrupt
        joined.append(name)
        return join(flights, name)

    monkeypatch.setattr(single_flight.LocalFlights, "join", interrupted_join)
    with pytest.raises(KeyboardInterrupt):
        cache.get_or_compute_many(["a", "b", "c", "d"], lambda hashes: [])
    monkeypatch.undo()
    compute = Computation(seed=2)
    thread, out = in_thread(lambda: cache.get_or_compute("a", compute))
    assert finished(thread), "a flight the interrupted batch led was left behind"
    assert bit_equal(out[0], make_tensor(SHAPE, DTYPE, 2))


def test_a_batch_of_more_keys_than_answers_kept_waits_on_every_one_held_elsewhere(
    cache, disk_dir, monkeypatch
):
    """Another instance holds every key of a batch larger than the answers the
    claim agent keeps uncollected (shortened here from 4096): each is waited
    for. The oldest answers were dropped before the batch collected them, and
    a missing answer counts as a won claim: computed at once, twice in all."""
    monkeypatch.setattr(ClaimAgent, "_MAX_ANSWERS", 8)
    hashes = [f"held-{i}" for i in range(24)]
    holder = DirectoryClaims(claims_dir_for(str(disk_dir)))
    for mm_hash in hashes:
        assert holder.claim(cache.key(mm_hash).storage_name, 600)
    out = cache.get_or_compute_many(
        hashes, lambda asked: [make_tensor(SHAPE, DTYPE, 1) for _ in asked], wait_s=0.2
    )
    assert len(out) == len(hashes)
    assert cache.stats.snapshot()["get_or_compute"]["waits"] == len(hashes)


def test_close_during_a_compute_withdraws_its_claim(cache, disk_dir):
    """The cache is closed while a compute runs: its claim is withdrawn at the
    close (the result will not be stored), not left to make every other
    instance wait out its TTL."""
    compute = Computation(seed=4, hold=True)
    thread, out = in_thread(lambda: cache.get_or_compute("closing", compute))
    assert compute.started.wait(JOIN_S)
    name = cache.key("closing").storage_name
    cache.close()
    assert DirectoryClaims(claims_dir_for(str(disk_dir))).claim(name, 60)  # free
    compute.go.set()
    assert finished(thread)
    assert bit_equal(out[0], make_tensor(SHAPE, DTYPE, 4))  # its caller still gets it


def test_a_batch_left_unstored_by_a_close_says_so_in_one_line(cache, caplog):
    started, go = threading.Event(), threading.Event()

    def compute(asked: list[str]) -> list[torch.Tensor]:
        started.set()
        assert go.wait(JOIN_S)
        return [make_tensor(SHAPE, DTYPE, i) for i in range(len(asked))]

    hashes = [f"batch-{i}" for i in range(20)]
    thread, out = in_thread(lambda: cache.get_or_compute_many(hashes, compute))
    assert started.wait(JOIN_S)
    cache.close()
    caplog.set_level(logging.WARNING, logger="lmcache_ec.storage.get_or_compute")
    go.set()
    assert finished(thread) and len(out[0]) == len(hashes)
    said = [r.getMessage() for r in caplog.records if "not stored" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("get_or_compute: 20 not stored")


def test_a_removal_while_an_entry_is_computed_keeps_its_result_out_of_the_tiers(cache):
    """``remove(k)`` while ``k`` is computed: its caller gets the result, but it
    is not stored (it was stored after the removal and served, undoing it)."""
    compute = Computation(seed=5, hold=True)
    thread, out = in_thread(lambda: cache.get_or_compute("removed", compute))
    assert compute.started.wait(JOIN_S)
    assert not cache.remove("removed")  # nothing stored yet
    compute.go.set()
    assert finished(thread)
    assert bit_equal(out[0], make_tensor(SHAPE, DTYPE, 5))
    assert cache.contains("removed") is None
    assert cache.stats.snapshot()["get_or_compute"]["not_stored"] == 1
