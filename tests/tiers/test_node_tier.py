"""The node tier: one host copy per node, shared by its processes (``tiers/node.py``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from lmcache_ec.tiers import node as node_module
from lmcache_ec.tiers.disk_layout import TEMP_PREFIX, DirectoryLayout
from lmcache_ec.tiers.node import USERS_FILE, node_path
from tests.conftest import bit_equal, make_tensor, traced_peak

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (256, 1024)  # bfloat16: 512 KB payload
IMAGES = 6
RANKS = 4


@pytest.fixture
def node_base():
    base = tempfile.mkdtemp(prefix="ec-node-test-", dir="/dev/shm")
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _config(node_base: str) -> dict:
    return {
        "local_cpu": True,  # the node tier takes its role: the pool only stages
        "max_local_cpu_size": 0.05,
        "local_disk": None,
        "node_tier": True,
        "node_dir": node_base,
        "max_node_size": 0.5,
        "namespace": "node-test",
    }


def _tensor(i: int) -> torch.Tensor:
    return make_tensor(SHAPE, torch.bfloat16, seed=i)


RANK = textwrap.dedent(
    """
    import json, sys, torch
    from lmcache_ec import ECCache
    from tests.conftest import bit_equal, make_tensor
    config, images = json.loads(sys.argv[1]), int(sys.argv[2])
    tensors = [make_tensor((256, 1024), torch.bfloat16, seed=i) for i in range(images)]
    with ECCache.from_config(config, model="org/vlm", dtype=torch.bfloat16) as cache:
        # Every rank computes the same encoder outputs and stores them.
        stored = [cache.put(f"img-{i}", t) for i, t in enumerate(tensors)]
        where = [cache.contains(f"img-{i}") for i in range(images)]
        exact = [bit_equal(cache.get(f"img-{i}"), t) for i, t in enumerate(tensors)]
        node = cache.stats.snapshot()["tiers"]["node"]
        print(json.dumps({
            "stored": stored, "where": where, "exact": exact, "tiers": cache.tiers,
            "pool_bytes": cache._cpu.used_bytes(),
            "cpu_entries": len(cache._cpu.entries()),
            "skipped_existing": node.get("skipped_existing", 0),
        }))
    """
)


def test_four_ranks_hold_each_image_once(node_base, make_cache):
    config = _config(node_base)
    directory = node_path(node_base, "node-test")
    # A process of the node using the tier throughout (an engine's other rank,
    # a co-located engine): the entries outlive the four ranks for as long.
    with make_cache(config, model="org/vlm", dtype=torch.bfloat16):
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RANK, json.dumps(config), str(IMAGES)],
                cwd=ROOT,
                env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR"},
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(RANKS)
        ]
        outputs = [p.communicate(timeout=300)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outputs
        reports = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
        for report in reports:
            assert report["tiers"] == ["node"]
            assert all(report["stored"]) and all(report["exact"])
            assert report["where"] == ["node"] * IMAGES
            # No private copy: the pool staged the puts and holds nothing now.
            assert report["pool_bytes"] == 0 and report["cpu_entries"] == 0
        # Host memory: each image once in /dev/shm, whichever rank wrote it.
        files = os.listdir(directory)
        assert not [f for f in files if f.startswith(TEMP_PREFIX)]
        entries = DirectoryLayout(directory).scan().entries
        assert len(entries) == IMAGES
        frame = entries[0].size
        assert all(e.size == frame for e in entries)
        shm_bytes = sum(os.stat(os.path.join(directory, f)).st_blocks * 512 for f in files)
        assert frame * IMAGES <= shm_bytes < frame * IMAGES + 4096 * IMAGES
        assert sum(r["skipped_existing"] for r in reports) == (RANKS - 1) * IMAGES
        assert stat_mode(directory) == 0o700
    # The last process using the node tier is gone: so is what it held.
    assert DirectoryLayout(directory).scan().entries == []


def stat_mode(path: str) -> int:
    return os.stat(path).st_mode & 0o777


def _mapped_file(address: int) -> str | None:
    """The file mapped at ``address`` in this process, from /proc/self/maps."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5] if len(fields) > 5 else None
    return None


def test_reads_are_private_copies(node_base, make_cache):
    tensor = _tensor(1)
    cache = make_cache(_config(node_base), dtype=torch.bfloat16)
    assert cache.put("img", tensor)
    out = cache.get("img")
    assert bit_equal(out, tensor)
    path = cache._storage.storage_backends["NodeBackend"].path_of(cache.key("img"))
    # Not a mapping of the shared file: a truncation of it cannot reach the caller.
    assert _mapped_file(out.data_ptr()) != path
    out.fill_(0)  # the caller owns what it got
    assert bit_equal(cache.get("img"), tensor)
    assert cache._cpu.used_bytes() == 0


PADDING = 256 * 1024**2  # sparse on tmpfs: costs nothing until read


def test_padded_entry_is_a_miss_removed_without_reading_its_padding(node_base, make_cache):
    """A frame's file must be exactly header + payload: a longer one is damaged,
    and reading it must not allocate what the padding claims."""
    cache = make_cache(_config(node_base), dtype=torch.bfloat16)
    assert cache.put("img", _tensor(1))
    path = cache._storage.storage_backends["NodeBackend"].path_of(cache.key("img"))
    size = os.path.getsize(path)
    os.truncate(path, size + PADDING)
    answer, peak = traced_peak(lambda: cache.get("img"))
    assert answer is None
    assert peak < 4 * size
    assert cache.stats.snapshot()["integrity_failures"] == 1
    assert not os.path.exists(path)


KILLED = textwrap.dedent(
    """
    import os, sys, time, json, torch
    from lmcache_ec import ECCache
    from lmcache_ec.tiers.frame_directory import FrameDirectoryTier
    from tests.conftest import make_tensor

    config = json.loads(sys.argv[1])
    open_tmp = FrameDirectoryTier._open_tmp

    class PausedHalfway:
        def __init__(self, stream, path):
            self.stream, self.path = stream, path
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.stream.__exit__(*exc)
        def write(self, buffer):
            data = memoryview(buffer).cast("B")
            self.stream.write(data[: len(data) // 2])
            self.stream.flush()
            print("HALF", self.path, flush=True)
            time.sleep(600)

    def paused(self, path):
        stream = open_tmp(self, path)
        return PausedHalfway(stream, path) if "pause" in sys.argv else stream

    FrameDirectoryTier._open_tmp = paused
    with ECCache.from_config(config, model="m", dtype=torch.bfloat16) as cache:
        for i in range(3):
            assert cache.put(f"done-{i}", make_tensor((256, 1024), torch.bfloat16, seed=i))
        sys.argv.append("pause")
        cache.put("killed", make_tensor((256, 1024), torch.bfloat16, seed=9))
    """
)


def test_writer_killed_mid_write_leaves_the_node_tier_consistent(node_base, make_cache):
    config = _config(node_base)
    holder = make_cache(config, dtype=torch.bfloat16)  # keeps the tier in use
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", KILLED, json.dumps(config)],
            cwd=ROOT,
            env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR"},
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = child.stdout.readline()
            assert line.startswith("HALF "), line
            temp = line.split(" ", 1)[1].strip()
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
            child.stdout.close()
        assert os.path.exists(temp)  # the torn write is only a temp file
        with make_cache(config, dtype=torch.bfloat16) as cache:
            assert not os.path.exists(temp)  # reclaimed at start: its writer is dead
            assert cache.contains("killed") is None
            assert cache.get("killed") is None
            assert all(bit_equal(cache.get(f"done-{i}"), _tensor(i)) for i in range(3))
            assert cache.stats.snapshot()["integrity_failures"] == 0
            node = cache._storage.storage_backends["NodeBackend"]
            on_shm = sum(size for _, size, _ in node.entries())
            assert node.budget.ledger() == on_shm  # no bytes leaked in the accounting
            # And it is writable again.
            assert cache.put("killed", _tensor(9))
            assert bit_equal(cache.get("killed"), _tensor(9))
    finally:
        holder.close()
    # The killed writer never left, yet the last one to leave cleared the tier.
    directory = node_path(node_base, "node-test")
    assert DirectoryLayout(directory).scan().entries == []


def test_the_last_user_to_leave_clears_the_node_tier(node_base, make_cache):
    config = _config(node_base)
    first = make_cache(config, dtype=torch.bfloat16)
    with make_cache(config, dtype=torch.bfloat16) as second:
        assert first.put("img", _tensor(1))
        first.close()  # another user remains: the entry stays
        assert bit_equal(second.get("img"), _tensor(1))
        directory = second._storage.storage_backends["NodeBackend"].path
    assert DirectoryLayout(directory).scan().entries == []
    assert DirectoryLayout(directory).scan().temp_bytes == 0


def test_entries_nobody_uses_are_removed_by_the_next_user(node_base, tmp_path, make_cache):
    """Files a process left without closing (killed, crashed) and nobody uses."""
    config = _config(node_base)
    with make_cache(config, dtype=torch.bfloat16) as cache:
        assert cache.put("img", _tensor(1))
        node = cache._storage.storage_backends["NodeBackend"]
        path = node.path_of(cache.key("img"))
        shutil.copy2(path, tmp_path / "left")
    shutil.copy2(tmp_path / "left", path)  # as a process that ended without leaving left it
    cache = make_cache(config, dtype=torch.bfloat16)
    assert not os.path.exists(path)
    assert cache.get("img") is None
    node = cache._storage.storage_backends["NodeBackend"]
    assert node.budget.ledger() == 0


def _two_users_and_a_directory_made_again(node_base, make_cache):
    """Two users of the node tier (one process is enough: the ``.users`` lock is
    per open file), an entry each before the directory is deleted under them
    (a cleanup job, systemd's RemoveIPC), then ``first``'s write makes it again."""
    config = _config(node_base)
    first = make_cache(config, dtype=torch.bfloat16)
    second = make_cache(config, dtype=torch.bfloat16)
    assert first.put("before", _tensor(0))
    shutil.rmtree(node_path(node_base, "node-test"))
    assert first.put("after", _tensor(1))
    assert first._storage.node.counters["dir_recreated"] == 1
    return first, second


def test_a_node_directory_made_again_keeps_its_users(node_base, make_cache):
    """Without them on its new ``.users``, the next process to start thinks it
    is alone and clears the entries of the live ones."""
    first, second = _two_users_and_a_directory_made_again(node_base, make_cache)
    with make_cache(_config(node_base), dtype=torch.bfloat16) as third:
        assert third._storage.node._users.cleared_at_start == 0
        assert bit_equal(third.get("after"), _tensor(1))
    # The third left, not the last: nothing cleared either.
    assert bit_equal(first.get("after"), _tensor(1))
    assert second.contains("after") == "node"


def test_a_user_joins_a_directory_another_made_again_at_its_next_write(node_base, make_cache):
    first, second = _two_users_and_a_directory_made_again(node_base, make_cache)
    assert second.put("second", _tensor(2))  # finds a .users it does not hold
    first.close()  # not the last user: the second uses the directory of now
    assert bit_equal(second.get("after"), _tensor(1))
    assert bit_equal(second.get("second"), _tensor(2))


def test_a_user_leaving_a_directory_another_made_again_clears_nothing(node_base, make_cache):
    """``second`` never wrote since: its lock is on the deleted ``.users``,
    where it is alone; it must not take itself for the last user."""
    first, second = _two_users_and_a_directory_made_again(node_base, make_cache)
    second.close()
    assert bit_equal(first.get("after"), _tensor(1))


STOPPED_HOLDER = textwrap.dedent(
    """
    import fcntl, os, signal, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a user clearing the directory
    print("held", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    """
)


def test_an_engine_starts_without_the_node_tier_while_a_stopped_process_holds_it(
    node_base, make_cache, monkeypatch
):
    """A user stopped (SIGSTOP, a frozen cgroup, a debugger) while it clears the
    directory holds ``.users`` exclusively for good: a start waits a bounded
    time, then runs without the node tier."""
    monkeypatch.setattr(node_module, "USERS_LOCK_WAIT_S", 0.2)
    users = os.path.join(node_path(node_base, "node-test"), USERS_FILE)
    holder = subprocess.Popen(
        [sys.executable, "-c", STOPPED_HOLDER, users], stdout=subprocess.PIPE, text=True
    )
    started: dict = {}
    try:
        assert holder.stdout.readline() == "held\n"
        _, status = os.waitpid(holder.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        start = threading.Thread(
            target=lambda: started.update(cache=make_cache(_config(node_base))), daemon=True
        )
        start.start()
        start.join(30)  # a bound on a hang, not a timing: it returns after 0.2 s
        assert not start.is_alive(), "the engine's start is blocked on .users"
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    cache = started["cache"]
    assert cache.tiers == ["cpu"]
    assert cache.stats.snapshot()["features_off"] == {"node_tier": "directory_unusable"}
    assert cache.put("img", _tensor(1))
    assert bit_equal(cache.get("img"), _tensor(1))
