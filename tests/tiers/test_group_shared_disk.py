"""A disk directory shared by users of one group (``local_disk_group_shared``)
is one directory to every user of it (``tiers/budget.py``, ``disk_layout.py``):

- its size limit holds across users: their writes, interleaved, never leave
  it holding more than its limit (the ledger is in the directory, made 0660,
  not in each user's runtime directory);
- a hit by one user on another user's entry makes it the most recently used,
  so LRU eviction takes the entry nobody used, not the one just read;
- a ledger that is no file of the group's (a symlink, a FIFO, an outsider's
  file) is never used: the tier keeps the limit per user and says so once.

The users are two uids of a group made up for the test, in processes forked
from this one (no imports as them: the venv may be closed to them) that drop
to their uid and group before touching the directory, as ``setpriv --reuid
--regid --groups`` would start them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import tempfile
import traceback
from collections.abc import Callable, Iterator

import pytest
import torch

from lmcache_ec import codec
from lmcache_ec.key import ECKey, EncoderIdentity
from lmcache_ec.tiers.disk_layout import DirectoryLayout, DirectoryModes
from lmcache_ec.tiers.frame_directory import FrameDirectoryTier
from lmcache_ec.tiers.group_ledger import GROUP_LEDGER
from tests.conftest import make_tensor

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: children switch uids")

GROUP = 4242  # the group the users share (needs no entry in /etc/group)
USER_A, USER_B = 65534, 65533
SHARED = DirectoryModes.of(True)
SIZE = 4096  # one entry of the limit test
CHILD_BOUND_S = 60  # a bound on a hung child, not a timing


class _DiskTier(FrameDirectoryTier):
    name = "disk"


@pytest.fixture
def tree() -> Iterator[dict[str, str]]:
    """A 2770 directory of the group, and a node directory like /dev/shm (where
    a user's own ledgers would be), in a tree every user may enter."""
    base = tempfile.mkdtemp(prefix="ec-group-test-")
    os.chmod(base, 0o755)
    shared = os.path.join(base, "shared")
    os.mkdir(shared)
    os.chown(shared, 0, GROUP)
    os.chmod(shared, 0o2770)
    shm = os.path.join(base, "shm")
    os.mkdir(shm)
    os.chmod(shm, 0o1777)
    yield {"shared": shared, "shm": shm}
    shutil.rmtree(base, ignore_errors=True)


def _tier(tree: dict[str, str], limit: int) -> _DiskTier:
    return _DiskTier(tree["shared"], limit, 0.0, None, "cpu", tree["shm"], SHARED)


def _put(tier: _DiskTier, entries: dict[str, str]) -> list:
    """Write each entry (its bytes in hex): whether it was written."""
    return [tier._reserve_and_write(n, bytes.fromhex(h), len(h) // 2) for n, h in entries.items()]


def _get(tier: _DiskTier, name: str) -> str | None:
    """A read of entry ``name``: its bytes in hex, None for a miss."""
    read = tier.get_frame(ECKey(name))
    return None if read is None else read.frame.tobytes().hex()


class _User:
    """A process of ``uid`` with a tier on the shared directory, forked and then
    dropped to that uid and the group, as ``setpriv --reuid --regid --groups``
    would start it; it runs the calls it is sent (``_put``, ``_get``) in turn."""

    OPS: dict[str, Callable] = {"put": _put, "get": _get}

    def __init__(self, uid: int, tree: dict[str, str], limit: int) -> None:
        self.uid = uid
        ask_r, self._ask = os.pipe()
        self._reply, reply_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self._ask)
            os.close(self._reply)
            self._serve(uid, ask_r, reply_w, tree, limit)
        os.close(ask_r)
        os.close(reply_w)
        self._replies = os.fdopen(self._reply, "rb")
        assert self._answer() == "ready"

    @staticmethod
    def _serve(uid: int, ask_r: int, reply_w: int, tree: dict[str, str], limit: int) -> None:
        code = 1
        try:
            with os.fdopen(ask_r, "rb") as asks, os.fdopen(reply_w, "wb", 0) as replies:
                try:
                    os.setgroups([GROUP])
                    os.setgid(GROUP)
                    os.setuid(uid)
                    os.umask(0o022)  # a common umask: it would take the group's write bit
                    tier = _tier(tree, limit)
                    replies.write(json.dumps({"answer": "ready"}).encode() + b"\n")
                    for line in asks:
                        op, args = json.loads(line)
                        answer = _User.OPS[op](tier, *args)
                        replies.write(json.dumps({"answer": answer}).encode() + b"\n")
                    code = 0
                except BaseException:
                    replies.write(json.dumps({"error": traceback.format_exc()}).encode() + b"\n")
        finally:
            os._exit(code)

    def _answer(self) -> object:
        ready, _, _ = select.select([self._replies], [], [], CHILD_BOUND_S)  # a bound on a hang
        line = self._replies.readline() if ready else b""
        reply = json.loads(line or b'{"error": "no answer"}')
        assert "error" not in reply, f"uid {self.uid}: {reply['error']}"
        return reply["answer"]

    def __call__(self, op: str, *args: object) -> object:
        os.write(self._ask, json.dumps([op, args]).encode() + b"\n")
        return self._answer()

    def close(self) -> None:
        os.close(self._ask)
        self._replies.close()
        # Done with it: it waits for more calls (a sibling forked later holds a
        # copy of its pipe, so it sees no end), or it hung.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


@pytest.fixture
def users(tree) -> Iterator[Callable[[int, int], _User]]:
    """``users(uid, limit)``: a process of that user of the group."""
    started: list[_User] = []

    def start(uid: int, limit: int) -> _User:
        started.append(_User(uid, tree, limit))
        return started[-1]

    yield start
    for user in started:
        user.close()


def _names(*labels: str) -> list[str]:
    identity = EncoderIdentity(model="m")
    return [identity.key(label).to_string() for label in labels]


def _bytes_in(shared: str) -> int:
    """Entries and writes in progress: what counts against the limit."""
    return DirectoryLayout(shared, SHARED).scan(reclaim=False).total


def test_users_of_a_group_writing_in_turn_never_take_the_directory_past_its_limit(tree, users):
    limit = 8 * SIZE
    a, b = users(USER_A, limit), users(USER_B, limit)
    names = _names(*(f"e{i}" for i in range(16)))
    for user, batch in ((a, names[:4]), (b, names[4:8]), (a, names[8:12]), (b, names[12:])):
        written = user("put", {name: bytes(SIZE).hex() for name in batch})
        assert written == [True] * len(batch), (user.uid, written)
        assert _bytes_in(tree["shared"]) <= limit, user.uid
    ledger = os.stat(os.path.join(tree["shared"], GROUP_LEDGER))
    assert (ledger.st_mode & 0o777, ledger.st_gid) == (0o660, GROUP)
    assert _tier(tree, limit).budget.ledger() == _bytes_in(tree["shared"])


def _frame(label: str, seed: int) -> bytes:
    tensor = make_tensor((32, 64), torch.float32, seed=seed)
    header = codec.encode_header(EncoderIdentity(model="m").key(label), tensor)
    buffer = torch.zeros(codec.frame_size(header, tensor), dtype=torch.uint8)
    codec.write_frame(buffer, header, tensor)
    return buffer.numpy().tobytes()


def _kernel_clock_past(shared: str, mtime_ns: int) -> None:
    """Wait (bounded) until the kernel's clock, which sets a "now" mtime and
    may lag the process's by a tick, is past ``mtime_ns``."""
    probe = os.path.join(shared, ".clock-probe")
    open(probe, "wb").close()
    try:
        for _ in range(100_000):
            os.utime(probe, None)
            if os.stat(probe).st_mtime_ns > mtime_ns:
                return
        raise AssertionError("the kernel's clock never passed the entry's mtime")
    finally:
        os.remove(probe)


def test_a_hit_by_another_user_of_the_group_keeps_the_entry_from_lru_eviction(tree, users):
    one, two, three = _names("e1", "e2", "e3")
    frames = {name: _frame(f"e{seed}", seed) for seed, name in enumerate((one, two, three), 1)}
    limit = 2 * len(frames[one]) + len(frames[one]) // 2  # two entries fit, three do not
    a, b = users(USER_A, limit), users(USER_B, limit)
    assert a("put", {one: frames[one].hex(), two: frames[two].hex()}) == [True, True]
    layout = DirectoryLayout(tree["shared"], SHARED)
    _kernel_clock_past(tree["shared"], os.stat(layout.path_of(two)).st_mtime_ns)
    assert b("get", one) == frames[one].hex()
    assert a("put", {three: frames[three].hex()}) == [True]
    left = {name for name in (one, two, three) if os.path.exists(layout.path_of(name))}
    assert left == {one, three}  # e2, unused since written, went; e1, just read, stayed


def _plant_symlink(path: str, outside: str) -> None:
    os.symlink(outside, path)


def _plant_fifo(path: str, outside: str) -> None:
    os.mkfifo(path, 0o660)


def _plant_outsiders_file(path: str, outside: str) -> None:
    with open(path, "w") as stream:
        stream.write("0")
    os.chown(path, 12345, 12345)  # neither this user nor the directory's group
    os.chmod(path, 0o666)


@pytest.mark.parametrize(
    "plant",
    [_plant_symlink, _plant_fifo, _plant_outsiders_file],
    ids=["symlink", "fifo", "outsiders-file"],
)
def test_a_ledger_that_is_no_file_of_the_group_is_never_used(tree, plant, caplog):
    outside = os.path.join(os.path.dirname(tree["shared"]), "outside")
    with open(outside, "w") as stream:
        stream.write("kept")
    ledger = os.path.join(tree["shared"], GROUP_LEDGER)
    plant(ledger, outside)
    planted = os.lstat(ledger)
    caplog.set_level(logging.WARNING, logger="lmcache_ec")
    tier = _tier(tree, 8 * SIZE)  # starts: never an engine that fails to
    names = _names("e1", "e2")
    assert [tier._reserve_and_write(name, bytes(SIZE), SIZE) for name in names] == [True, True]
    assert tier.budget.ledger() == 2 * SIZE  # this user's ledger keeps the limit
    assert tier.budget.unshared is not None
    said = [r.getMessage() for r in caplog.records if "shared_ledger off" in r.getMessage()]
    assert len(said) == 1 and ledger in said[0], said
    with open(outside) as stream:
        assert stream.read() == "kept"
    now = os.lstat(ledger)
    assert (now.st_ino, now.st_size, now.st_mode) == (
        planted.st_ino,
        planted.st_size,
        planted.st_mode,
    )
