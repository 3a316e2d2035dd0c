"""One size limit per directory, kept by every process sharing it (``budget.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from lmcache_ec.key import EncoderIdentity
from lmcache_ec.tiers.budget import DirectoryBudget
from lmcache_ec.tiers.disk_layout import TEMP_PREFIX, DirectoryLayout
from tests.conftest import bit_equal, make_tensor

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (128, 1024)  # float16: 256 KB payload
FRAME = SHAPE[0] * SHAPE[1] * 2 + 4096  # a generous upper bound of one frame


def _config(disk_dir, frames: float, residency: float = 5.0) -> dict:
    return {
        "local_cpu": False,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "max_local_disk_size": FRAME * frames / 1024**3,
        "min_residency_s": residency,
    }


def _directory_bytes(disk_dir) -> int:
    """Every file of the directory, entries and writes in progress alike; a
    write just published by ``link`` is one file under two names."""
    sizes = {}
    for name in os.listdir(disk_dir):
        with contextlib.suppress(FileNotFoundError):  # published or removed meanwhile
            stat = os.stat(os.path.join(disk_dir, name))
            sizes[stat.st_ino] = stat.st_size
    return sum(sizes.values())


def _held_directory_bytes(budget: DirectoryBudget, disk_dir) -> int:
    """``_directory_bytes`` while no process may reserve or evict: files can
    then only shrink or go, so this bounds the directory at that moment."""
    with budget.locked():
        return _directory_bytes(disk_dir)


WRITER = textwrap.dedent(
    """
    import json, sys, torch
    from lmcache_ec import ECCache
    from tests.conftest import make_tensor
    config, rank, count = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    with ECCache.from_config(config, model="org/vlm") as cache:
        for i in range(count):
            assert cache.put(f"r{rank}-{i}", make_tensor((128, 1024), torch.float16, seed=i))
        assert cache.flush(60)
        print(json.dumps(cache.stats.snapshot()["tiers"]["disk"]))
    """
)


@pytest.mark.parametrize("residency", [0.0, 5.0], ids=["global-lru", "fresh-protected"])
def test_three_processes_share_one_limit(disk_dir, residency, make_cache):
    limit_frames = 8
    config = _config(disk_dir, limit_frames, residency)
    limit = int(FRAME * limit_frames)
    per_process = 5 * limit_frames // 3 + 1  # 5x the capacity in all
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, json.dumps(config), str(rank), str(per_process)],
            cwd=ROOT,
            env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR"},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(3)
    ]
    budget = DirectoryBudget(DirectoryLayout(str(disk_dir)), limit, residency)
    samples = []
    while any(p.poll() is None for p in procs):
        samples.append(_held_directory_bytes(budget, disk_dir))
        time.sleep(0.001)  # let the writers have the lock
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    samples.append(_directory_bytes(disk_dir))
    assert len(samples) > 3
    assert max(samples) <= limit, (max(samples), limit)
    counters = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    assert all(c.get("write_errors", 0) == 0 for c in counters)
    if residency == 0:  # every process wrote, evicting each other's entries
        assert all(c.get("skipped_no_room", 0) == 0 for c in counters)
    # Whatever survived, from whichever process, reads back exact.
    names = {e.name for e in DirectoryLayout(str(disk_dir)).scan().entries}
    cache = make_cache(config, model="org/vlm")
    kept = {
        (rank, i)
        for rank in range(3)
        for i in range(per_process)
        if cache.key(f"r{rank}-{i}").storage_name in names
    }
    assert len(kept) == len(names) >= limit_frames // 2
    for rank, i in kept:
        expected = make_tensor(SHAPE, torch.float16, seed=i)
        assert bit_equal(cache.get(f"r{rank}-{i}"), expected)


def test_a_write_in_progress_counts_in_full_when_another_process_rescans(disk_dir):
    layout = DirectoryLayout(str(disk_dir))
    first, second = (DirectoryBudget(layout, 150, min_residency=0) for _ in range(2))
    name = EncoderIdentity(model="m", dtype="float16").key("a").storage_name
    temp = first.reserve(name, 100)
    assert temp is not None and os.path.getsize(temp) == 0  # not one byte written yet
    # 100 + 60 does not fit: the rescan this forces must still see the 100.
    assert second.reserve(name + "b", 60) is None
    assert second.ledger() == 100
    assert layout.write(name, bytes(100), temp=temp)
    assert not os.path.exists(temp)
    assert layout.scan().total == 100


def test_a_burst_never_evicts_another_process_fresh_entries(disk_dir, make_cache):
    tensors = [make_tensor(SHAPE, torch.float16, seed=i) for i in range(8)]
    config = _config(disk_dir, 4.5, residency=600)
    with (
        make_cache(config) as first,
        make_cache(config) as second,
    ):
        for i in range(3):
            assert first.put(f"a{i}", tensors[i])
        assert first.flush(10)
        for i in range(5):
            assert second.put(f"b{i}", tensors[3 + i])
            assert second.flush(10)
        # The burst made room from its own oldest entries; the other engine's stay.
        assert [first.contains(f"a{i}") for i in range(3)] == ["disk"] * 3
        assert second.contains("b4") == "disk"
        assert second.contains("b0") is None
        assert _directory_bytes(disk_dir) <= FRAME * 4.5
        assert all(bit_equal(first.get(f"a{i}"), tensors[i]) for i in range(3))


def test_a_start_with_a_smaller_limit_spares_another_process_fresh_entries(disk_dir, make_cache):
    """A rolling restart lowers the limit: the first engine restarted trims the
    directory at its start, but not the entries the others still running wrote
    within min_residency_s (it deleted them, under a running engine's feet)."""
    tensors = [make_tensor(SHAPE, torch.float16, seed=i) for i in range(4)]
    running = make_cache(_config(disk_dir, 8.5, residency=600))
    for i in range(4):
        assert running.put(f"r{i}", tensors[i])
    assert running.flush(10)
    make_cache(_config(disk_dir, 2.5, residency=600))  # restarted with a smaller limit
    assert [running.contains(f"r{i}") for i in range(4)] == ["disk"] * 4
    make_cache(_config(disk_dir, 2.5, residency=0))  # once they are idle, they go
    assert [running.contains(f"r{i}") for i in range(4)] == [None, None, "disk", "disk"]


def test_idle_entries_of_any_process_go_least_recently_used_first(disk_dir, make_cache):
    tensors = [make_tensor(SHAPE, torch.float16, seed=i) for i in range(4)]
    config = _config(disk_dir, 3.5, residency=0)
    with (
        make_cache(config) as first,
        make_cache(config) as second,
    ):
        for i in range(3):
            assert first.put(f"e{i}", tensors[i])
            assert first.flush(10)
        # A hit in one engine refreshes the entry for every engine on the directory.
        assert bit_equal(second.get("e0"), tensors[0])
        assert second.put("e3", tensors[3])
        assert second.flush(10)
        stored = [f"e{i}" for i in range(4) if first.contains(f"e{i}") == "disk"]
        assert stored == ["e0", "e2", "e3"]


def test_dead_writers_temp_files_are_reclaimed_at_once(disk_dir, make_cache):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = disk_dir / f"{TEMP_PREFIX}{dead.pid}-0.ec1.a.b"
    live = disk_dir / f"{TEMP_PREFIX}{os.getpid()}-0.ec1.a.b"
    orphan.write_bytes(b"half a frame")
    live.write_bytes(b"being written")
    with make_cache():
        pass
    assert not orphan.exists() and live.exists()


def test_concurrent_writers_in_one_process_keep_the_limit(disk_dir, make_cache):
    config = _config(disk_dir, 6, residency=0)
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(_directory_bytes(disk_dir))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with make_cache(config) as cache:
            for i in range(30):
                assert cache.put(f"x{i}", make_tensor(SHAPE, torch.float16, seed=i))
            assert cache.flush(30)
    finally:
        done.set()
        sampler.join()
    frame = os.path.getsize(next(iter(disk_dir.glob("*.pt"))))
    assert max(samples) <= FRAME * 6 + frame
    assert _directory_bytes(disk_dir) <= FRAME * 6


def test_idle_ledgers_are_pruned_but_never_one_in_use(tmp_path):
    import fcntl

    from lmcache_ec.tiers.budget import prune_ledgers

    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    fresh, idle, held = (ledgers / name for name in ("1-1", "1-2", "1-3"))
    for path in (fresh, idle, held):
        path.write_text("100")
    day_ago = os.path.getmtime(fresh) - 2 * 24 * 3600
    for path in (idle, held):
        os.utime(path, (day_ago, day_ago))
    with open(held, "rb+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another process is inside the ledger
        assert prune_ledgers(str(ledgers)) == 1
    assert sorted(os.listdir(ledgers)) == ["1-1", "1-3"]


def test_a_ledger_pruned_while_waiting_is_opened_again(disk_dir, make_cache):
    """A writer blocked on the ledger's lock while it is pruned must not keep
    accounting in the unlinked file while others use the new one."""
    import fcntl
    import time

    cache = make_cache(_config(disk_dir, frames=8), model="m/ledger")
    budget = cache._storage.storage_backends["LocalDiskBackend"].budget
    path = budget._ledger_path()
    with open(path, "a"):
        pass
    links: list[int] = []

    def writer() -> None:
        with budget._locked() as fd:
            links.append(os.fstat(fd).st_nlink)

    with open(path, "rb+") as pruner:
        fcntl.flock(pruner, fcntl.LOCK_EX)
        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(0.2)  # the writer has opened the old file and waits for its lock
        os.unlink(path)
    thread.join(10)
    assert links == [1] and os.path.exists(path)


def test_the_ledger_equals_the_bytes_on_disk_after_a_removal_and_a_lost_race(disk_dir, make_cache):
    """The ledger only over-counts when a writer dies or files go behind its back:
    a removal by the tier and a publish lost to another writer both give their
    bytes back at once."""
    tensors = {f"e{i}": make_tensor(SHAPE, torch.float16, seed=i) for i in range(3)}
    cache = make_cache(_config(disk_dir, 8, residency=0))
    disk, budget = cache._disk, cache._disk.budget
    assert all(cache.put_many(tensors))
    assert cache.flush(10)
    assert budget.ledger() == _directory_bytes(disk_dir) > 0
    assert cache.remove("e0")
    assert budget.ledger() == _directory_bytes(disk_dir)
    # Another writer published e1 first: this write reserves, writes, loses.
    frame = os.path.getsize(disk.path_of(cache.key("e1")))
    memory_obj = cache._cpu.allocate_frame(frame)
    memory_obj.ref_count_up()  # what submit_put_task takes for the write
    disk.write_entry(cache.key("e1"), memory_obj, None)
    memory_obj.ref_count_down()
    assert disk.counters["skipped_existing"] == 1
    assert budget.ledger() == _directory_bytes(disk_dir)


def test_a_ledger_held_for_good_stops_neither_a_start_nor_a_write(
    disk_dir, make_cache, monkeypatch
):
    """Another process keeps the directory's ledger locked (stopped while it
    held it): an engine on the directory still starts, its writes fail within
    the bound and are counted, and they land again once the lock is free."""
    import fcntl

    from lmcache_ec.tiers import budget as module

    monkeypatch.setattr(module, "LEDGER_LOCK_WAIT_S", 0.2)
    disk_dir.mkdir(parents=True, exist_ok=True)
    # The ledger the engine will use: the same directory's, found the same way.
    ledger = DirectoryBudget(DirectoryLayout(str(disk_dir)), FRAME, 0)._ledger_path()
    holder = os.open(ledger, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    caches = []
    try:
        start = threading.Thread(target=lambda: caches.append(make_cache(_config(disk_dir, 8))))
        start.daemon = True
        start.start()
        start.join(10)
        assert not start.is_alive(), "the engine's start waited on the ledger"
        (cache,) = caches
        assert cache.put("held", make_tensor(SHAPE, torch.float16))
        assert cache.flush(10)
        assert cache._disk.counters["write_errors"] == 1
        assert cache.contains("held") is None
    finally:
        os.close(holder)
    assert cache.put("free", make_tensor(SHAPE, torch.float16, seed=1))
    assert cache.flush(10)
    assert cache.contains("free") == "disk"
