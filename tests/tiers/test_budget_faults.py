"""A directory's size limit survives a failing ledger, hostile file names and a
directory made again (``budget.py``, ``disk_layout.py``); a header read meets a
FIFO or a symlink under an entry's name as damage, never a hang.

- a reservation whose ledger write fails leaves no temp file (none counted);
- a temp file's name is trusted no further than a write could make it: pids 0
  and 1 are no writer's, a reservation beyond the limit counts at the file's
  own size, and an mtime counts no later than the ctime (no user sets that);
- every process sharing a directory path follows it to its new ledger when
  the directory is made again, not only the one that made it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from lmcache_ec.purge import selection
from lmcache_ec.tiers import disk_layout
from lmcache_ec.tiers.budget import DirectoryBudget
from lmcache_ec.tiers.disk_layout import TEMP_PREFIX, DirectoryLayout, is_temp
from tests.conftest import bit_equal, make_tensor
from tests.tiers.budgets import entry_names, publish

LIMIT = 1000
HUGE = 99_999_999_999_999  # ~100 TB: more than any directory's limit
FUTURE = time.time() + 10 * 365 * 86400


def _temp_files(directory) -> list[str]:
    return [name for name in os.listdir(directory) if is_temp(name)]


def _directory_bytes(directory) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))


def _plant(directory, owner: int, reserved: int, content: bytes = b"") -> Path:
    """A temp file under a name no write of ours made, its mtime in the future."""
    path = Path(directory) / f"{TEMP_PREFIX}{owner}-0-{reserved}.planted"
    path.write_bytes(content)
    os.utime(path, (FUTURE, FUTURE))
    return path


# -- a ledger that cannot be written ------------------------------------------


# -- temp-file names ------------------------------------------------------------


@pytest.mark.parametrize("owner", [0, 1], ids=["pid-0", "pid-1"])
def test_a_temp_file_of_pid_0_or_1_is_reclaimed_not_counted(disk_dir, owner):
    planted = _plant(disk_dir, owner, 100)
    scan = DirectoryLayout(str(disk_dir)).scan()
    assert scan.temp_bytes == 0
    assert not planted.exists()


def test_a_temp_name_reserving_more_than_the_limit_evicts_nothing(disk_dir):
    """A live writer's pid, a reservation of ~100 TB: another process's start-up
    trim and writes count the file at its own size, and evict nothing for it."""
    names = entry_names(4)
    writer = DirectoryBudget(DirectoryLayout(str(disk_dir)), LIMIT, 0.0)
    for name in names[:3]:
        publish(writer, name, 100)
    planted = _plant(disk_dir, os.getpid(), HUGE, content=bytes(10))
    other = DirectoryBudget(DirectoryLayout(str(disk_dir)), LIMIT, 0.0)
    assert other.trim().evicted == 0
    publish(other, names[3], 100)
    entries = DirectoryLayout(str(disk_dir)).scan(max_reserved=LIMIT).entries
    assert sorted(e.name for e in entries) == sorted(names)
    assert other.ledger() == 4 * 100 + 10
    assert planted.exists()  # a live writer's, as far as anyone can tell: left alone


def test_a_temp_file_with_a_future_mtime_still_goes_stale(disk_dir, monkeypatch):
    """An mtime counts no later than the ctime, which no user can set: an
    mtime set years ahead does not keep a temp file counted for good."""
    monkeypatch.setattr(disk_layout, "STALE_TEMP_SECONDS", 0.1)
    planted = _plant(disk_dir, os.getpid(), 100)
    layout = DirectoryLayout(str(disk_dir))
    deadline = time.monotonic() + 5
    while planted.exists() and time.monotonic() < deadline:
        layout.scan()
        time.sleep(0.02)
    assert not planted.exists()
    assert layout.scan().temp_bytes == 0


def test_a_planted_temp_file_neither_empties_the_disk_tier_nor_stops_its_writes(
    disk_dir, make_cache
):
    config = {
        "local_cpu": False,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 0.01,
        "min_residency_s": 0,
    }
    tensors = [make_tensor((64, 256), torch.bfloat16, seed=i) for i in range(6)]
    with make_cache(config, dtype=torch.bfloat16) as writer:
        for i in range(3):
            assert writer.put(f"k{i}", tensors[i])
        assert writer.flush(10)
    _plant(disk_dir, 1, HUGE)
    cache = make_cache(config, dtype=torch.bfloat16)  # its start-up trim scans
    for i in range(3, 6):
        assert cache.put(f"k{i}", tensors[i])
    assert cache.flush(10)
    assert [cache.contains(f"k{i}") for i in range(6)] == ["disk"] * 6
    assert all(bit_equal(cache.get(f"k{i}"), tensors[i]) for i in range(6))
    assert cache._disk.counters["skipped_no_room"] == 0


# -- a directory made again --------------------------------------------------------


def test_a_directory_made_again_moves_every_process_to_its_new_ledger(disk_dir):
    """Two processes share the path; the directory is moved aside and made
    again, and only one of them notices (its write found it missing). The
    other's next reservation still counts the first one's writes."""
    first = DirectoryBudget(DirectoryLayout(str(disk_dir)), LIMIT, 0.0)
    second = DirectoryBudget(DirectoryLayout(str(disk_dir)), LIMIT, 0.0)
    names = entry_names(7)
    publish(first, names[0], 100)
    publish(second, names[1], 100)  # both hold the old directory's ledger now
    os.rename(disk_dir, disk_dir.with_name("moved-aside"))
    disk_dir.mkdir(mode=0o700)
    first.directory_changed()  # what the tier that made it again does
    for name in names[2:6]:
        publish(first, name, 200)
    publish(second, names[6], 400)  # fits only by evicting the first's
    assert _directory_bytes(disk_dir) <= LIMIT
    assert first.ledger() == second.ledger() == _directory_bytes(disk_dir)


# -- header reads ----------------------------------------------------------------


def _read_headers(entries: list[selection.Entry], within: float) -> bool:
    """``read_disk_header`` of each entry, as purge selection and ``ls`` do,
    on a thread; whether it finished within ``within`` seconds."""

    def run() -> None:
        for entry in entries:
            selection.read_disk_header(entry)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(within)
    return not reader.is_alive()


@pytest.mark.parametrize("planted", ["fifo", "symlink-to-fifo"])
def test_a_fifo_under_an_entry_name_is_damaged_not_a_hang(disk_dir, tmp_path, make_cache, planted):
    cache = make_cache()
    tensor = make_tensor((16, 64), torch.float16)
    assert cache.put("kept", tensor) and cache.flush(10)
    fifo = disk_dir / f"{cache.key('victim').storage_name}{disk_layout.SUFFIX}"
    target = fifo if planted == "fifo" else tmp_path / "pipe"
    os.mkfifo(target, 0o600)
    if planted == "symlink-to-fifo":
        os.symlink(target, fifo)
    entries = selection.scan_disk(str(disk_dir))
    try:
        assert _read_headers(entries, within=5), "a header read waited on the FIFO"
    finally:  # a reader stuck in open(2) is let go by a writer's open
        with contextlib.suppress(OSError):
            os.close(os.open(target, os.O_WRONLY | os.O_NONBLOCK))
    errors = {e.name: e.error for e in entries}
    assert errors == {
        cache.key("kept").storage_name: None,
        cache.key("victim").storage_name: "not a regular file",
    }
    assert bit_equal(cache.get("kept"), tensor)
