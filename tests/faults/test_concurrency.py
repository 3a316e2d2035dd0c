"""Several processes on the same keys, and a process killed mid-write.

Real processes share one disk directory and one Redis. Writers and readers
race on the same keys while the disk tier evicts; a writer is SIGKILLed while
its temporary file is open. Every read, in every process, is the exact tensor
or a miss, and no reader ever sees a torn entry (``integrity_failures`` stays
0): disk writes are temp file + rename, Redis writes one MULTI/EXEC.
"""

from __future__ import annotations

import json
import os
import queue
import random
import textwrap
import threading
import time

import pytest
import torch

from lmcache_ec import ECCache, codec
from lmcache_ec.key import ECKey
from lmcache_ec.remote_names import REDIS_DATA_SUFFIX
from tests.conftest import make_tensor
from tests.faults.checks import exact_or_miss, get_checked, snapshot
from tests.faults.processes import worker
from tests.faults.stores import RawRemote
from tests.remote.conftest import remote_config

WORKER = textwrap.dedent(
    """
    import json, random, sys, torch
    from lmcache_ec import ECCache
    from tests.conftest import make_tensor
    from tests.faults.checks import exact_or_miss

    disk, url, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # No CPU hot cache and a disk tier smaller than the working set: every read goes
    # to files that other processes are writing and evicting at the same time.
    disk_config = {"local_cpu": False, "max_local_cpu_size": 0.02, "local_disk": disk,
                   "max_local_disk_size": 12 * 64 * 256 * 2 / 1024**3}
    # Remote only, no CPU hot cache: every read is a GET of a key others are setting.
    redis_config = {"local_cpu": False, "max_local_cpu_size": 0.02, "remote_url": url,
                    "remote_timeout": 5}
    rng = random.Random(seed)
    counts = {"disk": [0, 0, 0], "redis": [0, 0, 0]}  # hits, misses, reads
    with ECCache.from_config(disk_config, model="stress") as on_disk, \\
            ECCache.from_config(redis_config, model="stress") as on_redis:
        caches = {"disk": on_disk, "redis": on_redis}
        for _ in range(150):
            for tier, cache in caches.items():
                i = rng.randrange(24)
                expected = make_tensor((64, 256), torch.float16, seed=i)
                if rng.random() < 0.4:
                    assert cache.put(f"img-{i}", expected) in (True, False)
                else:
                    hit = exact_or_miss(cache.get(f"img-{i}"), expected)
                    counts[tier][0 if hit else 1] += 1
                    counts[tier][2] += 1
        stats = {tier: cache.stats.snapshot() for tier, cache in caches.items()}
    print(json.dumps({tier: {"hits": c[0], "misses": c[1], "reads": c[2],
                             "failures": stats[tier]["integrity_failures"],
                             "stat_hits": sum(stats[tier]["hits"].values()),
                             "stat_misses": stats[tier]["misses"],
                             "tier_errors": stats[tier]["tier_errors"]}
                      for tier, c in counts.items()}))
    """
)


def test_processes_sharing_a_disk_directory_and_redis(disk_dir, redis_url, fault_table):
    workers = [worker(WORKER, str(disk_dir), redis_url, str(seed)) for seed in range(3)]
    total_hits = {"disk": 0, "redis": 0}
    total_reads = 0
    for proc in workers:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        result = json.loads(out)
        for tier, counts in result.items():
            total_hits[tier] += counts["hits"]
            total_reads += counts["reads"]
            # Atomic renames and MULTI/EXEC: no reader ever sees a torn entry.
            assert counts["failures"] == 0, (tier, counts)
            assert counts["tier_errors"] == {}, (tier, counts)
            # Every read is counted once, as a hit or a miss.
            assert counts["stat_hits"] + counts["stat_misses"] == counts["reads"]
            assert counts["hits"] == counts["stat_hits"]
    assert total_hits["disk"] > 0 and total_hits["redis"] > 0
    leftovers = [p for p in disk_dir.iterdir() if ".tmp-" in p.name]
    assert not leftovers
    fault_table(
        "3 processes writing and reading the same keys (disk with eviction, Redis)",
        f"{total_reads} reads: {total_hits['disk']} disk and {total_hits['redis']} Redis "
        "exact hits, the rest misses; 0 torn or wrong entries",
        "n/a",
    )


KILLED_WRITER = textwrap.dedent(
    """
    import os, sys, time, torch
    from lmcache_ec import ECCache
    from lmcache_ec.tiers.local_disk import ECLocalDiskBackend
    from tests.conftest import make_tensor

    disk, url, pause_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    opened = [0]
    open_tmp = ECLocalDiskBackend._open_tmp

    class PausedHalfway:
        # The disk write of one generation stops halfway through its bytes, on
        # disk and flushed, and reports where: the kill lands inside that write.
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.stream.__exit__(*exc)

        def write(self, buffer):
            data = memoryview(buffer).cast("B")
            self.stream.write(data[: len(data) // 2])
            self.stream.flush()
            os.fsync(self.stream.fileno())
            print("paused", self.stream.name, len(data), flush=True)
            time.sleep(3600)  # until killed

    def open_tmp_pausing(self, tmp):
        stream = open_tmp(self, tmp)
        opened[0] += 1
        return PausedHalfway(stream) if opened[0] == pause_at + 1 else stream

    ECLocalDiskBackend._open_tmp = open_tmp_pausing
    config = {"local_cpu": False, "max_local_cpu_size": 0.05, "local_disk": disk,
              "max_local_disk_size": 1, "remote_url": url, "remote_timeout": 5}
    with ECCache.from_config(config, model="killed") as cache:
        print("ready", flush=True)
        i = 0
        while True:  # until killed
            cache.put(f"gen-{i}", make_tensor((1024, 1024), torch.float16, seed=i))
            cache.flush(600)  # returns only when the write is done, not while paused
            if i >= 12:
                cache.remove(f"gen-{i - 12}")
            print(i, flush=True)
            i += 1
    """
)
KILLED_SHAPE = (1024, 1024)  # float16: 2 MB frames
PAUSE_AT = 6  # the generation whose disk write is killed halfway


def _verify_frame(data: bytes, name: str) -> None:
    """A whole, valid frame for ``name`` (raises CorruptEntryError otherwise)."""
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    codec.decode_payload(buffer, ECKey.from_storage_name(name))


def test_writer_killed_mid_write_leaves_no_torn_entry(disk_dir, redis_url, fault_table, make_cache):
    config = {**remote_config(redis_url), "local_disk": str(disk_dir), "local_cpu": False}
    disk_only = {"local_cpu": False, "max_local_cpu_size": 0.05, "local_disk": str(disk_dir)}
    expected = {}

    def tensor(i: int) -> torch.Tensor:
        if i not in expected:
            expected[i] = make_tensor(KILLED_SHAPE, torch.float16, seed=i)
        return expected[i]

    proc = worker(KILLED_WRITER, str(disk_dir), redis_url, str(PAUSE_AT))
    stop = threading.Event()
    reads = {"hit": 0, "miss": 0}
    errors: list[BaseException] = []
    progress = [-1]
    paused: queue.Queue[list[str]] = queue.Queue()

    def follow_progress() -> None:
        for line in proc.stdout:
            if line.strip().isdigit():
                progress[0] = int(line)
            elif line.startswith("paused "):
                paused.put(line.split())

    def read_concurrently(cache: ECCache) -> None:
        rng = random.Random(7)
        try:
            while not stop.is_set():
                newest = progress[0]
                if newest < 0:
                    time.sleep(0.01)
                    continue
                # Entries being written too, but never the one whose write is killed:
                # a remote hit on it would be promoted to disk by this reader.
                i = rng.randint(max(0, newest - 14), min(newest + 1, PAUSE_AT - 1))
                reads["hit" if get_checked(cache, f"gen-{i}", tensor(i)) else "miss"] += 1
        except BaseException as exc:
            errors.append(exc)

    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-3000:]
        threading.Thread(target=follow_progress, daemon=True).start()
        with make_cache(config, model="killed") as reader:
            thread = threading.Thread(target=read_concurrently, args=(reader,))
            thread.start()
            try:
                # The writer reports from inside its write of generation PAUSE_AT.
                _, tmp, frame_bytes = paused.get(timeout=120)
            except queue.Empty:
                pytest.fail(f"the writer never reached its paused write: {proc.poll()=}")
            # The state this test is about: half a frame on disk, under a temporary
            # name only; the entry's own name does not exist yet, and a reader that
            # looks for it on disk misses it (no torn read).
            final = disk_dir / f"{reader.key(f'gen-{PAUSE_AT}').storage_name}.pt"
            assert progress[0] == PAUSE_AT - 1
            assert os.path.dirname(tmp) == str(disk_dir)
            assert f".tmp-{proc.pid}-" in os.path.basename(tmp)
            assert 0 < os.path.getsize(tmp) < int(frame_bytes)
            assert not final.exists()
            with make_cache(disk_only, model="killed") as on_disk:
                assert not get_checked(on_disk, f"gen-{PAUSE_AT}", tensor(PAUSE_AT))
                assert snapshot(on_disk)["integrity_failures"] == 0
            proc.kill()
            proc.wait(timeout=10)
            stop.set()
            thread.join(timeout=60)
            assert not errors, errors
            assert snapshot(reader)["integrity_failures"] == 0
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    written = progress[0]
    assert written == PAUSE_AT - 1

    orphans = [p.name for p in disk_dir.iterdir() if ".tmp-" in p.name]
    # The killed write left its temporary file behind, and nothing under the entry's name.
    assert orphans == [os.path.basename(tmp)]
    assert not final.exists()
    # What survived on disk and in Redis is whole: every entry verifies.
    for path in disk_dir.glob("*.pt"):
        _verify_frame(path.read_bytes(), path.name.removesuffix(".pt"))
    raw = RawRemote(redis_url)
    try:
        names = [
            k.removesuffix(REDIS_DATA_SUFFIX)
            for k in raw.stored_keys()
            if k.endswith(REDIS_DATA_SUFFIX)
        ]
        for name in names:
            _verify_frame(raw.get(name), name)
    finally:
        raw.close()
    # A fresh process's view: exact or miss for every generation, nothing torn.
    with make_cache(config, model="killed") as fresh:
        hits = [
            exact_or_miss(fresh.get(f"gen-{i}"), tensor(i))
            for i in range(max(0, written - 14), written + 2)
        ]
        assert sum(hits) >= 1
        state = snapshot(fresh)
        assert state["integrity_failures"] == 0
        assert state["misses"] == len(hits) - sum(hits)
        # Orphaned temporary files are never indexed as entries.
        indexed = {os.path.basename(path) for _, _, path in fresh._disk.entries()}
        assert not indexed & set(orphans)
    fault_table(
        "writer SIGKILLed mid-write (half a frame in its temp file)",
        f"{reads['hit']} concurrent exact hits, {reads['miss']} misses, 0 torn reads; "
        f"{len(orphans)} orphan temp file(s), never indexed; all stored frames verify",
        "n/a (restart serves at once)",
    )
