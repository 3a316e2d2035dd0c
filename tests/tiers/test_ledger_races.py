"""The disk size ledger never under-counts (``budget.py``): a file's deletion and
the subtraction of its bytes happen under one hold of the ledger's lock, so a
scan by another process can never see the file gone and then have its bytes
taken off a second time."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from typing import BinaryIO

import pytest

from lmcache_ec.key import ECKey, EncoderIdentity
from lmcache_ec.tiers import budget as budget_module
from lmcache_ec.tiers.budget import DirectoryBudget
from lmcache_ec.tiers.disk_layout import DirectoryLayout, is_temp
from lmcache_ec.tiers.frame_directory import FrameDirectoryTier

SIZE = 4096  # one entry
LIMIT = 16 * SIZE


class _DiskTier(FrameDirectoryTier):
    name = "disk"


def _names(count: int) -> list[str]:
    identity = EncoderIdentity(model="m")
    return [identity.key(f"e{i}").to_string() for i in range(count)]


def _tier_with_entries(disk_dir, count: int) -> tuple[_DiskTier, list[str]]:
    tier = _DiskTier(str(disk_dir), LIMIT, 0.0, None, "cpu")
    names = _names(count)
    for name in names:
        assert tier._reserve_and_write(name, bytes(SIZE), SIZE)
    assert tier.budget.ledger() == count * SIZE
    return tier, names


def _real_bytes(disk_dir) -> int:
    return DirectoryLayout(str(disk_dir)).scan(reclaim=False).total


def _temp_files(disk_dir) -> list[str]:
    return [name for name in os.listdir(disk_dir) if is_temp(name)]


def _scan_racing(disk_dir, race: Callable[[], object], monkeypatch) -> None:
    """Another process rescans the directory (``trim``: the ledger reset to what
    it finds) while ``race`` runs on a thread; the scan lists the directory
    only once that thread waits for the ledger's lock, which the scan holds."""
    racer_waits = threading.Event()
    flock_within = budget_module.flock_within

    def announced_flock_within(fd: int, seconds: float, what: str) -> None:
        if threading.current_thread() is racer:
            racer_waits.set()
        flock_within(fd, seconds, what)

    monkeypatch.setattr(budget_module, "flock_within", announced_flock_within)
    racer = threading.Thread(target=race)

    class ListsOnceTheRacerWaits(DirectoryLayout):
        def _items(self) -> Iterator[os.DirEntry]:
            racer.start()
            assert racer_waits.wait(10), "the racing thread never asked for the ledger"
            yield from super()._items()

    other = DirectoryBudget(ListsOnceTheRacerWaits(str(disk_dir)), LIMIT, 0.0)
    other.trim()
    racer.join(10)
    assert not racer.is_alive()


def test_a_removal_racing_another_process_scan_never_under_counts(disk_dir, monkeypatch):
    tier, names = _tier_with_entries(disk_dir, 3)
    removed: list[bool] = []
    _scan_racing(disk_dir, lambda: removed.append(tier.remove(ECKey(names[0]))), monkeypatch)
    assert removed == [True]
    assert not os.path.exists(tier.layout.path_of(names[0]))
    assert tier.budget.ledger() >= _real_bytes(disk_dir) == 2 * SIZE
    assert tier.budget.ledger() == 2 * SIZE


class _FailsHalfway:
    """An opener whose write lands part of the frame, then fails (a full disk)."""

    def __init__(self, layout: DirectoryLayout) -> None:
        self.layout = layout

    def __call__(self, temp: str) -> BinaryIO:
        with self.layout.open_temp(temp) as stream:
            stream.write(bytes(SIZE // 2))
        raise OSError(errno.EIO, "injected write failure")


@pytest.mark.parametrize("outcome", ["lost-publish-race", "failed-write"])
def test_a_reservation_given_back_racing_another_process_scan_never_under_counts(
    disk_dir, monkeypatch, outcome
):
    tier, (existing,) = _tier_with_entries(disk_dir, 1)
    fresh = _names(2)[1]
    name = existing if outcome == "lost-publish-race" else fresh
    if outcome == "failed-write":
        monkeypatch.setattr(tier, "_open_tmp", _FailsHalfway(tier.layout))
    # Reserved before the other process's scan; the write and its giving back race it.
    temp = tier.budget.reserve(name, SIZE)
    assert temp is not None
    monkeypatch.setattr(tier, "_reserve", lambda _name, _size: temp)
    results: list[object] = []

    def write() -> None:
        try:
            results.append(tier._reserve_and_write(name, bytes(SIZE), SIZE))
        except OSError as exc:
            results.append(exc.errno)

    _scan_racing(disk_dir, write, monkeypatch)
    assert results == ([False] if outcome == "lost-publish-race" else [errno.EIO])
    assert _temp_files(disk_dir) == []
    assert tier.budget.ledger() >= _real_bytes(disk_dir) == SIZE
    assert tier.budget.ledger() == SIZE


@contextlib.contextmanager
def _ledger_held_by_another(tier: FrameDirectoryTier) -> Iterator[None]:
    """Another process holds the ledger's lock (stopped inside it); the tier's
    waits for it end at once."""
    tier.budget.lock_wait_s = 0.05
    holder = os.open(tier.budget._ledger_path(), os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(holder)


def test_a_removal_without_the_ledger_lock_deletes_and_over_counts(disk_dir):
    tier, names = _tier_with_entries(disk_dir, 3)
    key = ECKey(names[0])
    with _ledger_held_by_another(tier):
        assert tier.remove(key)
    assert not os.path.exists(tier.path_of(key))
    assert tier.counters["remove_errors"] == 0
    assert tier.budget.ledger() == 3 * SIZE  # the next scan takes it off
    assert _real_bytes(disk_dir) == 2 * SIZE


def test_a_reservation_given_back_without_the_ledger_lock_leaves_no_temp_file(
    disk_dir, monkeypatch
):
    tier, (existing,) = _tier_with_entries(disk_dir, 1)
    temp = tier.budget.reserve(existing, SIZE)
    assert temp is not None
    monkeypatch.setattr(tier, "_reserve", lambda _name, _size: temp)
    with _ledger_held_by_another(tier):
        assert tier._reserve_and_write(existing, bytes(SIZE), SIZE) is False
    assert _temp_files(disk_dir) == []
    assert tier.budget.ledger() == 2 * SIZE  # over, never under
    assert _real_bytes(disk_dir) == SIZE


def test_a_write_that_does_not_publish_leaves_only_a_reserved_temp_file(disk_dir):
    layout = DirectoryLayout(str(disk_dir))
    (name,) = _names(1)
    assert layout.write(name, bytes(SIZE))
    assert not layout.write(name, bytes(SIZE))  # no reservation: nothing left
    assert _temp_files(disk_dir) == []
    temp = layout.create_temp(name, SIZE)
    assert not layout.write(name, bytes(SIZE), temp=temp)
    assert os.path.exists(temp)  # for the budget to delete as it gives the bytes back
