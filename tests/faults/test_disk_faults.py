"""The disk tier failing under a running engine: full, deleted, read-only.

The filesystem conditions are real (``fs.py``: a small tmpfs or a lowered
``RLIMIT_FSIZE``; a read-only bind mount, ``chattr +i`` or ``chmod``). Puts
keep returning True (the CPU tier holds the entry), reads are the exact tensor
or a miss, failed writes leave no temporary files, the disk tier's counters
(``tiers.disk``, ``tier_errors.disk``) record the failures, and the time from
the end of the fault until a new entry reaches the disk again is measured.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time

import torch

from lmcache_ec import ECCache
from tests.conftest import make_tensor
from tests.faults.checks import contains_checked, get_checked, put_checked, snapshot, wait_for
from tests.faults.stores import disk_path

FRAME_TENSOR = (512, 1024)  # float32: 2 MB frames, above fs.RLIMIT_BYTES
NEVER_RECOVERS = 30.0


def _tensor(seed: int) -> torch.Tensor:
    return make_tensor(FRAME_TENSOR, torch.float32, seed=seed)


def _config(disk_dir, *, cpu_frames: float = 3.5, local_cpu: bool = True) -> dict:
    frame = FRAME_TENSOR[0] * FRAME_TENSOR[1] * 4 + 4096
    return {
        "local_cpu": local_cpu,
        "max_local_cpu_size": frame * cpu_frames / 1024**3,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 1.0,  # larger than the filesystem under test
    }


def _disk_state(cache: ECCache) -> dict:
    return snapshot(cache)["tiers"]["disk"]


def _leftover_temp_files(disk_dir) -> list[str]:
    return [p.name for p in disk_dir.iterdir() if ".tmp-" in p.name]


def _recovers(cache: ECCache, disk_dir, prefix: str) -> float:
    """Seconds until a newly put entry is written to the disk tier again."""
    attempt = 0

    def written() -> bool:
        nonlocal attempt
        attempt += 1
        name = f"{prefix}-{attempt}"
        assert put_checked(cache, name, _tensor(900 + attempt))
        cache.flush(10)
        return disk_path(disk_dir, cache.key(name)).exists()

    return wait_for(written, NEVER_RECOVERS, "disk writes after the fault ended")


def test_disk_full(full_disk, disk_dir, fault_table, make_cache):
    with make_cache(_config(disk_dir)) as cache:
        before = {f"before-{i}": _tensor(i) for i in range(2)}
        for name, tensor in before.items():
            assert put_checked(cache, name, tensor)
        assert cache.flush(10)
        assert all(disk_path(disk_dir, cache.key(n)).exists() for n in before)

        full_disk.fill()
        try:
            during = {f"during-{i}": _tensor(10 + i) for i in range(5)}
            for name, tensor in during.items():
                assert put_checked(cache, name, tensor)  # the CPU tier takes it
                # One at a time: a write in flight pins its CPU buffer (the
                # pool is 3 frames), and a put with no room returns False.
                assert cache.flush(10)
            disk = _disk_state(cache)
            assert disk["write_errors"] == len(during)
            assert disk["available"] is False
            assert snapshot(cache)["tier_errors"]["disk"] >= len(during)
            assert not _leftover_temp_files(disk_dir)
            # The CPU tier (3 frames) holds the newest; the rest are misses, never
            # wrong; entries on disk from before are still served. The newest are
            # read first: a disk hit's promotion into the CPU tier lands a moment
            # after its read and may then evict the least recently used entry.
            hits = {name: get_checked(cache, name, t) for name, t in {**during, **before}.items()}
            assert all(hits[name] for name in before)
            assert hits["during-4"]
            assert not hits["during-0"]
        finally:
            full_disk.free()
        freed = time.monotonic()
        recovery = _recovers(cache, disk_dir, "after")
        assert _disk_state(cache)["available"] is True
        assert snapshot(cache)["integrity_failures"] == 0
        misses = sum(not hit for hit in hits.values())
    fault_table(
        f"disk full ({full_disk.method})",
        f"puts return True (CPU keeps the entry); {disk['write_errors']} disk writes failed "
        f"and counted, no temp files left; {misses} reads of evicted entries missed",
        recovery,
    )
    assert time.monotonic() - freed < NEVER_RECOVERS


def test_directory_deleted_under_a_running_engine(disk_dir, fault_table, make_cache):
    config = _config(disk_dir, local_cpu=False)
    with make_cache(config) as cache:
        tensors = {f"img-{i}": _tensor(i) for i in range(3)}
        for name, tensor in tensors.items():
            assert put_checked(cache, name, tensor)
        assert cache.flush(10)
        assert all(get_checked(cache, n, t) for n, t in tensors.items())

        shutil.rmtree(disk_dir)
        deleted = time.monotonic()
        assert not any(get_checked(cache, n, t) for n, t in tensors.items())
        assert all(contains_checked(cache, n) is None for n in tensors)
        assert _disk_state(cache)["vanished"] == len(tensors)

        # The next write makes the directory again; the tier works from then on.
        recovery = _recovers(cache, disk_dir, "after")
        assert disk_dir.is_dir()
        assert _disk_state(cache)["dir_recreated"] == 1
        assert get_checked(cache, "after-1", _tensor(901))
        assert snapshot(cache)["integrity_failures"] == 0
    fault_table(
        "disk directory deleted under a running engine",
        f"{len(tensors)} reads missed (counted as vanished), nothing raised; the next "
        "write recreated the directory",
        recovery,
    )
    assert time.monotonic() - deleted < NEVER_RECOVERS


def test_file_deleted_under_the_engine_is_a_plain_miss(disk_dir, make_cache):
    cache = make_cache(local_cpu=False)
    cache.put("img", torch.ones(4, 4))
    assert cache.flush()
    (path,) = disk_dir.glob("*.pt")
    path.unlink()
    assert cache.get("img") is None
    assert cache.stats.snapshot()["integrity_failures"] == 0
    assert _disk_state(cache)["vanished"] == 1


def test_read_only_directory(read_only, disk_dir, fault_table, make_cache, caplog):
    config = _config(disk_dir)
    good = {f"good-{i}": _tensor(i) for i in range(2)}
    damaged = _tensor(99)
    with make_cache(config) as writer:
        for name, tensor in {**good, "damaged": damaged}.items():
            assert put_checked(writer, name, tensor)
        damaged_path = disk_path(disk_dir, writer.key("damaged"))
    data = bytearray(damaged_path.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged_path.write_bytes(bytes(data))

    read_only.protect()
    with make_cache(config) as cache:
        assert all(get_checked(cache, n, t) for n, t in good.items())  # read from disk
        # A damaged entry that cannot be removed: a miss each time, counted,
        # logged once.
        with caplog.at_level(logging.WARNING, logger="lmcache_ec"):
            assert not get_checked(cache, "damaged", damaged)
            assert not get_checked(cache, "damaged", damaged)
        dropped = [r for r in caplog.records if "Dropping corrupt entry" in r.getMessage()]
        assert len(dropped) == 1
        assert snapshot(cache)["integrity_failures"] == 2
        assert _disk_state(cache)["remove_errors"] >= 1
        assert damaged_path.exists()

        new = {f"new-{i}": _tensor(20 + i) for i in range(2)}
        for name, tensor in new.items():
            assert put_checked(cache, name, tensor)
        assert cache.flush(10)
        disk = _disk_state(cache)
        assert disk["write_errors"] == len(new)
        assert disk["available"] is False
        assert snapshot(cache)["tier_errors"]["disk"] >= len(new) + 1
        assert all(get_checked(cache, n, t) for n, t in new.items())  # from the CPU tier
        assert not any(disk_path(disk_dir, cache.key(n)).exists() for n in new)

        method = read_only.method
        read_only.release()
        recovery = _recovers(cache, disk_dir, "after")
        assert _disk_state(cache)["available"] is True
    fault_table(
        f"read-only disk directory ({method})",
        "existing entries served; damaged entry a counted miss (cannot be removed); "
        f"{disk['write_errors']} writes failed and counted; CPU tier serves new entries",
        recovery,
    )


def _event_loops() -> int:
    return sum(t.name == "storage-manager-event-loop" for t in threading.enumerate())


def test_an_unusable_directory_leaves_the_disk_tier_off_and_no_thread_behind(read_only, disk_dir):
    read_only.protect()
    config = _config(disk_dir / "not-creatable")
    before = _event_loops()
    with ECCache.from_config(config, model="m") as cache:  # starts: the engine must
        assert cache.tiers == ["cpu"]
        assert cache.stats.snapshot()["features_off"] == {"disk_tier": "directory_unusable"}
    # The storage manager's (non-daemon) event loop was stopped: the process can exit.
    assert _event_loops() == before
