"""Directory claims: one holder at a time, across processes; expiry frees a dead holder's."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import threading
import time

from lmcache_ec.claims import ClaimStore, DirectoryClaims


def test_one_holder_until_release(tmp_path):
    first, second = DirectoryClaims(str(tmp_path)), DirectoryClaims(str(tmp_path))
    assert isinstance(first, ClaimStore)
    assert first.claim("item", 60)
    assert first.claim("item", 60)  # ours already
    assert not second.claim("item", 60)
    second.release("item")  # not its claim: nothing happens
    assert not second.claim("item", 60)
    first.release("item")
    assert second.claim("item", 60)
    assert not first.claim("item", 60)


def test_expired_claim_is_taken_over(tmp_path):
    dead, alive = DirectoryClaims(str(tmp_path)), DirectoryClaims(str(tmp_path))
    assert dead.claim("item", 0)  # expires at once: its holder never releases it
    assert alive.claim("item", 60)
    assert not dead.claim("item", 60)


def test_a_slow_holders_release_leaves_a_takeover_alone(tmp_path, monkeypatch):
    """The holder's claim expires and is taken over between its release's check
    of the owner and the removal: the new holder keeps its claim."""
    from lmcache_ec import claims as module

    slow, fast = DirectoryClaims(str(tmp_path)), DirectoryClaims(str(tmp_path))
    assert slow.claim("item", 0)  # expired at once
    read = module._read
    taken: list[bool] = []

    def taken_over_after_the_check(path):
        found = read(path)
        if not taken and path.endswith("item.claim"):
            monkeypatch.setattr(module, "_read", read)
            taken.append(fast.claim("item", 60))  # the takeover, in the window
        return found

    monkeypatch.setattr(module, "_read", taken_over_after_the_check)
    slow.release("item")
    assert taken == [True]
    assert not DirectoryClaims(str(tmp_path)).claim("item", 60)  # still the fast one's
    fast.release("item")
    assert DirectoryClaims(str(tmp_path)).claim("item", 60)


def test_a_takeover_racing_another_leaves_one_holder(tmp_path, monkeypatch):
    """B finds the dead holder's claim expired; A takes it over before B acts on
    that; D comes last. A alone holds the claim."""
    from lmcache_ec import claims as module

    directory = str(tmp_path)
    assert DirectoryClaims(directory).claim("item", 0)  # expired at once: a dead holder's
    a, b, d = (DirectoryClaims(directory) for _ in range(3))
    b._next_sweep = float("inf")  # the sweep's reads are not the one this test times
    read = module._read
    won: dict[str, bool] = {}

    def taken_over_after_bs_look(path):
        found = read(path)
        monkeypatch.setattr(module, "_read", read)
        won["a"] = a.claim("item", 60)
        return found

    monkeypatch.setattr(module, "_read", taken_over_after_bs_look)
    won["b"] = b.claim("item", 60)
    won["d"] = d.claim("item", 60)
    assert won == {"a": True, "b": False, "d": False}
    assert read(str(tmp_path / "item.claim"))[0] == a.owner


def test_a_lock_held_too_long_is_a_duplicate_not_a_wait(tmp_path):
    """Another process keeps the directory's lock (stopped while holding it): a
    claimant of an expired claim works anyway within the lock's bound."""
    directory = str(tmp_path)
    assert DirectoryClaims(directory).claim("item", 0)  # expired: a dead holder's
    held = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        answers: list[bool] = []
        claimant = threading.Thread(
            target=lambda: answers.append(DirectoryClaims(directory).claim("item", 60)),
            daemon=True,
        )
        claimant.start()
        claimant.join(5)
        assert not claimant.is_alive(), "the claimant waited on the lock"
        assert answers == [True]  # works on it anyway: at worst a duplicate encode
    finally:
        os.close(held)


def test_a_sweep_that_cannot_run_still_makes_the_claim(tmp_path):
    """The directory's lock is held when a store sweeps (its first claim does):
    the sweep is skipped, the claim file is still made, so a second claimant
    is told the item is taken instead of encoding it too."""
    directory = str(tmp_path)
    held = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        first, second = DirectoryClaims(directory), DirectoryClaims(directory)
        assert first.claim("item", 60)
        record = json.loads((tmp_path / "item.claim").read_text())
        assert record["owner"] == first.owner
        assert not second.claim("item", 60)
    finally:
        os.close(held)


def test_claiming_again_renews(tmp_path):
    from lmcache_ec.claims import _read

    first, second = DirectoryClaims(str(tmp_path)), DirectoryClaims(str(tmp_path))
    assert first.claim("item", 60)
    assert first.claim("item", 3600)  # ours and live: renewed for the new TTL
    assert _read(str(tmp_path / "item.claim"))[1] > time.time() + 3000
    assert not second.claim("item", 60)
    first.release("item")
    assert first.claim("item", 0)  # expired at once
    assert first.claim("item", 60)  # ours: renewed
    assert not second.claim("item", 60)


def test_garbage_claim_file_counts_as_expired(tmp_path):
    (tmp_path / "item.claim").write_bytes(b"\x00not json")
    assert DirectoryClaims(str(tmp_path)).claim("item", 60)


def test_bad_names_are_refused(tmp_path):
    claims = DirectoryClaims(str(tmp_path))
    for name in ("", "../escape", ".hidden"):
        try:
            claims.claim(name, 1)
        except ValueError:
            continue
        raise AssertionError(f"claim name {name!r} accepted")


def _race(directory: str, name: str, start, results) -> None:
    claims = DirectoryClaims(directory)
    start.wait()
    results.put(claims.claim(name, 60))


def _race_processes(directory: str, name: str, count: int) -> list[bool]:
    context = multiprocessing.get_context("spawn")
    start, results = context.Event(), context.Queue()
    processes = [
        context.Process(target=_race, args=(directory, name, start, results)) for _ in range(count)
    ]
    for process in processes:
        process.start()
    start.set()
    won = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(60)
    return won


def test_processes_racing_for_a_claim_one_wins(tmp_path):
    assert _race_processes(str(tmp_path), "fresh", 4).count(True) == 1


def test_processes_racing_for_an_expired_claim_one_wins(tmp_path):
    assert DirectoryClaims(str(tmp_path)).claim("old", 0)
    assert _race_processes(str(tmp_path), "old", 4).count(True) == 1
    leftovers = [n for n in os.listdir(tmp_path) if not n.endswith(".claim")]
    assert leftovers == []
