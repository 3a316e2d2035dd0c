"""What a directory tier (disk, node) does with an entry name that holds no
entry it can serve, and with a filesystem that fails every write.

Real files and processes: a FIFO or a symlink to one, a file larger than the
tier, a file this process may not read (another user's, or mode 000), a
directory under an entry's name, a full filesystem (``tests/faults/fs.py``).
Each is a miss at once (a read never waits on a FIFO nor allocates what a
file claims beyond the tier's limit), counted in the tier's counters, and
logged once per episode, not once per read or write; an entry no read can
serve is removed, so that the next put of its key writes one that serves.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from tests.conftest import bit_equal, make_tensor, traced_peak
from tests.faults.fs import FullDisk

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (512, 1024)  # float32: 2 MiB frames (above fs.RLIMIT_BYTES)
FROZEN = 30  # seconds: a bound on a read that hangs, not a timing


def _tensor(seed: int) -> torch.Tensor:
    return make_tensor(SHAPE, torch.float32, seed=seed)


def _disk_only(make_cache, disk_dir, limit_bytes: int = 1 << 30):
    return make_cache(
        local_cpu=False, local_disk=str(disk_dir), max_local_disk_size=limit_bytes / 1024**3
    )


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.parametrize("planted", ["fifo", "symlink-to-fifo"])
def test_a_fifo_under_an_entry_name_is_a_miss_not_a_hang(planted, disk_dir, tmp_path, make_cache):
    cache = _disk_only(make_cache, disk_dir)
    path = cache._disk.path_of(cache.key("img"))
    fifo = path if planted == "fifo" else str(tmp_path / "fifo")
    os.mkfifo(fifo)
    if planted != "fifo":
        os.symlink(fifo, path)
    got: dict = {}
    reader = threading.Thread(target=lambda: got.update(out=cache.get("img")), daemon=True)
    reader.start()
    try:
        reader.join(FROZEN)
        assert not reader.is_alive(), "get() waits for a writer of the FIFO"
    finally:
        if reader.is_alive():  # let the stuck read go, so the test ends
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            reader.join(FROZEN)
    assert got["out"] is None
    assert not os.path.lexists(path)  # removed: a put writes the entry again
    assert cache._disk.counters["damaged"] == 1
    assert cache.put("img", _tensor(1)) and cache.flush(10)
    assert bit_equal(cache.get("img"), _tensor(1))


def test_a_file_larger_than_the_tier_is_a_miss_before_anything_is_read(
    disk_dir, tmp_path, make_cache
):
    """A valid frame, larger than this tier's limit: no entry this process
    could have written (a process with a larger limit may have: it stays)."""
    with make_cache(local_disk=str(tmp_path / "roomy")) as roomy:
        assert roomy.put("img", _tensor(1)) and roomy.flush(10)
        frame = roomy._disk.path_of(roomy.key("img"))
        size = os.path.getsize(frame)
    cache = _disk_only(make_cache, disk_dir, limit_bytes=size // 2)
    path = cache._disk.path_of(cache.key("img"))
    shutil.copy(frame, path)
    asked: list[int] = []
    assert cache._disk.read_into_pool(cache.key("img"), lambda n: asked.append(n)) is None
    assert asked == []  # no pool buffer asked for
    answer, peak = traced_peak(lambda: cache.get("img"))
    assert answer is None
    assert peak < size // 4
    assert cache._disk.counters["read_skipped_too_large"] == 2
    assert os.path.exists(path)


UNREADABLE = textwrap.dedent(
    """
    import json, logging, os, sys, torch
    from lmcache_ec import ECCache
    from tests.conftest import bit_equal, make_tensor
    if os.geteuid() == 0:  # root reads any file: be another user, as in production
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
    said = []
    class Said(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())
    logging.getLogger("lmcache_ec").addHandler(Said(logging.WARNING))
    tensor = make_tensor((512, 1024), torch.float32, seed=7)
    with ECCache.from_config(json.loads(sys.argv[1]), model="m", dtype=torch.float32) as cache:
        node = cache._storage.node
        print(node.path_of(cache.key("img")), flush=True)
        sys.stdin.readline()  # the test plants a file this process cannot read there
        gets = [cache.get("img") for _ in range(5)]
        put = cache.put("img", tensor)
        out = cache.get("img")
        print(json.dumps({
            "hits": sum(g is not None for g in gets),
            "put": put,
            "exact": out is not None and bit_equal(out, tensor),
            "damaged": node.counters["damaged"],
            "warnings": len(said),
        }), flush=True)
    """
)


def test_an_entry_this_process_cannot_read_is_removed_and_written_again():
    """Another user's file in this user's node directory (or group-shared disk
    directory): ``contains`` said yes, a put was skipped as existing, every get
    failed with EACCES and logged. The directory's owner can remove it."""
    base = tempfile.mkdtemp(prefix="ec-node-test-", dir="/dev/shm")
    os.chmod(base, 0o1777)  # the child may be another user
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": None,
        "node_tier": True,
        "node_dir": base,
        "max_node_size": 0.5,
    }
    metrics = os.path.join(base, "prometheus")  # LMCache's default one is this user's
    os.mkdir(metrics)
    os.chmod(metrics, 0o1777)
    env = {**os.environ, "XDG_CACHE_HOME": f"{base}/xdg", "PROMETHEUS_MULTIPROC_DIR": metrics}
    child = subprocess.Popen(
        [sys.executable, "-c", UNREADABLE, json.dumps(config)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        path = child.stdout.readline().strip()
        assert path.endswith(".pt"), path
        with open(path, "wb") as planted:  # ours: another user's to the child, or mode 000
            planted.write(b"x" * 4096)
        os.chmod(path, 0)
        out, _ = child.communicate("go\n", timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        shutil.rmtree(base, ignore_errors=True)
    assert child.returncode == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {"hits": 0, "put": True, "exact": True, "damaged": 1, "warnings": 1}


def test_a_damaged_entry_that_cannot_be_removed_is_logged_once_an_episode(
    disk_dir, make_cache, caplog
):
    """A directory under an entry's name: met at every read of the key, removed
    by none. Counted each time; logged once until a read succeeds."""
    cache = _disk_only(make_cache, disk_dir)
    path = cache._disk.path_of(cache.key("img"))
    os.mkdir(path)
    Path(path, "inside").write_bytes(b"x")  # not empty: rmdir fails too
    with caplog.at_level(logging.WARNING, logger="lmcache_ec"):
        assert not any(cache.get("img") is not None for _ in range(10))
        assert len(_warnings(caplog, "not a regular file")) == 1
        assert cache.put("good", _tensor(2)) and cache.flush(10)
        assert bit_equal(cache.get("good"), _tensor(2))  # ends the episode
        assert cache.get("img") is None
    assert len(_warnings(caplog, "not a regular file")) == 2
    assert cache._disk.counters["damaged"] == 11
    assert os.path.isdir(path)


def test_a_full_disk_logs_one_line_per_episode_not_per_write(disk_dir, make_cache, caplog):
    disk = FullDisk(disk_dir)  # a small tmpfs, or a file-size rlimit where it cannot mount
    try:
        cache = make_cache(max_local_cpu_size=4 * 2**21 / 1024**3)
        with caplog.at_level(logging.WARNING, logger="lmcache_ec"):
            disk.fill()
            for i in range(5):
                assert cache.put(f"full-{i}", _tensor(i)) and cache.flush(10)
            assert len(_warnings(caplog, "write of")) == 1
            disk.free()
            assert cache.put("room", _tensor(10)) and cache.flush(10)  # ends the episode
            disk.fill()
            assert cache.put("full-again", _tensor(11)) and cache.flush(10)
            disk.free()
        assert len(_warnings(caplog, "write of")) == 2
        counters = cache._disk.counters
        assert counters["write_errors"] == 6
        assert os.path.exists(cache._disk.path_of(cache.key("room")))
        cache.close()
    finally:
        disk.close()
