"""A node-tier directory deleted under a running engine and made again by
another local user (``/dev/shm`` is everyone's, the path is predictable) is
never used: no frame of theirs is served, nothing is written or cleared
there, and nothing waits on a lock of theirs (``tiers/node.py``,
``tiers/frame_directory.py``).

The other user is uid 65534 (nobody): as root, the test makes the directory
and hands it to them (``chown``), as they would have made it.
"""

from __future__ import annotations

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

from lmcache_ec import codec
from lmcache_ec.tiers import node as node_module
from lmcache_ec.tiers.node import USERS_FILE
from tests.conftest import bit_equal, make_tensor

NOBODY = 65534
SHAPE = (64, 256)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files are given to nobody")


@pytest.fixture
def node_base():
    base = tempfile.mkdtemp(prefix="ec-owner-test-", dir="/dev/shm")
    os.chmod(base, 0o1777)  # as /dev/shm
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def cache(node_base, make_cache):
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": None,
        "node_tier": True,
        "node_dir": node_base,
        "max_node_size": 0.05,
        "namespace": "owner-test",
    }
    return make_cache(config, dtype=torch.bfloat16)


def _tensor(seed: int) -> torch.Tensor:
    return make_tensor(SHAPE, torch.bfloat16, seed=seed)


def _forged_frame(cache, mm_hash: str, tensor: torch.Tensor) -> bytes:
    """A well-formed frame for the key (the format and checksums are public)."""
    key = cache.key(mm_hash)
    header = codec.encode_header(key, tensor)
    buffer = torch.zeros(codec.frame_size(header, tensor), dtype=torch.uint8)
    codec.write_frame(buffer, header, tensor)
    return buffer.numpy().tobytes()


def _squat(cache, frames: dict[str, bytes] | None = None) -> Path:
    """The user directory deleted (a cleanup job), then the node directory's
    path made again by nobody (mode 0777), holding ``frames`` by storage name."""
    node = cache._storage.node
    directory = Path(node.path)
    user_dir = directory.parents[1]
    shutil.rmtree(user_dir)
    old = os.umask(0)
    try:
        directory.mkdir(mode=0o777, parents=True)
    finally:
        os.umask(old)
    for mm_hash, frame in (frames or {}).items():
        Path(node.path_of(cache.key(mm_hash))).write_bytes(frame)
    for path in [user_dir, *user_dir.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    return directory


def test_a_frame_in_a_node_directory_another_user_made_again_is_a_miss(cache):
    assert cache.put("img", _tensor(1))
    assert bit_equal(cache.get("img"), _tensor(1))
    _squat(cache, {"img": _forged_frame(cache, "img", _tensor(666))})
    node = cache._storage.node
    assert not node.contains(cache.key("img"))
    assert cache.get("img") is None  # never their tensor
    assert node.counters["damaged"] == 1


def test_a_put_into_a_node_directory_another_user_made_again_writes_nothing_there(cache):
    assert cache.put("img", _tensor(1))
    squatted = _squat(cache)
    assert not cache.put("img2", _tensor(2))  # refused, and said so
    assert cache._storage.node.counters["write_errors"] == 1
    assert os.listdir(squatted) == []  # no entry, temp file or .users of ours


def test_a_put_never_waits_on_a_users_lock_another_user_holds(cache, monkeypatch):
    """Without the ownership check, each put waited ``USERS_LOCK_WAIT_S`` on
    their ``.users``, then failed."""
    monkeypatch.setattr(node_module, "USERS_LOCK_WAIT_S", 20.0)
    assert cache.put("img", _tensor(1))
    users = _squat(cache) / USERS_FILE
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(users)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        os.chown(users, NOBODY, NOBODY)
        results: list[bool] = []
        put = threading.Thread(target=lambda: results.append(cache.put("img2", _tensor(2))))
        put.daemon = True
        put.start()
        put.join(10)  # a bound on a wait, not a timing: it returns at once
        assert not put.is_alive(), "the put waits on another user's .users"
        assert results == [False]
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a user clearing the directory, for good
    print("held", flush=True)
    time.sleep(120)
    """
)


def test_the_last_user_leaving_clears_nothing_in_a_directory_another_user_made_again(cache):
    """Its lock is on the deleted ``.users``: it moves it to the directory of
    now before deciding it is the last, and would clear theirs."""
    assert cache.put("img", _tensor(1))
    theirs = os.path.basename(cache._storage.node.path_of(cache.key("theirs")))
    squatted = _squat(cache, {"theirs": _forged_frame(cache, "theirs", _tensor(3))})
    cache.close()
    assert os.listdir(squatted) == [theirs]  # no .users of ours, nothing cleared
