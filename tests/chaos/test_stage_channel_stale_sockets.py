"""Stage sockets of killed engines do not pile up.

Each launch names its sockets anew, so a killed engine's are never bound
again. A worker's listener, as it starts, unlinks the stage sockets of its
directory that refuse connections (nobody listens), and nothing else: not a
live one (even one too busy to accept), not one just bound (it may not listen
yet), not a file that is no socket, not a link (nor what it points to), not a
socket of another name. A start probes a bounded number of them.

Each test uses a directory of its own; "old" is a modification time set a
minute back.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator

import pytest

from lmcache_ec.integration.vllm.channel import _SWEEP_MAX, StageListener


@pytest.fixture
def directory() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ec-sock-")  # short: room for a socket's name
    yield path
    shutil.rmtree(path)


def _dead(path: str, *, old: bool = True) -> str:
    """A socket file nobody listens on: what a killed worker leaves."""
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.close()
    if old:
        _age(path)
    return path


def _age(path: str) -> None:
    minute_ago = time.time() - 60
    os.utime(path, (minute_ago, minute_ago), follow_symlinks=False)


def _listening(path: str, backlog: int = 4) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.listen(backlog)
    _age(path)
    return sock


def _name(directory: str, engine: str, tp: int = 0) -> str:
    return os.path.join(directory, f"{engine}-0123456789abcdef-dp0-tp{tp}.sock")


def test_a_starting_worker_removes_dead_stage_sockets_and_nothing_else(directory):
    dead = [_dead(_name(directory, "killed", tp)) for tp in range(2)]
    older_version = _dead(os.path.join(directory, "engine-a-dp0-tp0.sock"))
    live = _listening(_name(directory, "live"))
    busy = _listening(_name(directory, "busy"), backlog=0)  # a full backlog: EAGAIN
    waiting = []
    for _ in range(4):
        peer = socket.socket(socket.AF_UNIX)
        peer.setblocking(False)
        try:
            peer.connect(busy.getsockname())
        except BlockingIOError:
            peer.close()
            break
        waiting.append(peer)
    assert len(waiting) < 4  # its backlog is full
    kept = [
        _dead(_name(directory, "just-bound"), old=False),  # may not listen yet
        _dead(os.path.join(directory, "other.sock")),  # not a stage socket's name
        live.getsockname(),
        busy.getsockname(),
    ]
    not_a_socket = _name(directory, "file")
    with open(not_a_socket, "w"):
        pass
    _age(not_a_socket)
    outside = tempfile.mkdtemp(prefix="ec-out-")
    target = _dead(os.path.join(outside, "t.sock"))
    link = _name(directory, "link")
    os.symlink(target, link)
    _age(link)
    kept += [not_a_socket, link, target]
    listener = StageListener(_name(directory, "new"), lambda identifiers, weights, link, rows: None)
    try:
        assert [path for path in [*dead, older_version] if os.path.lexists(path)] == []
        assert [path for path in kept if not os.path.lexists(path)] == []
        assert os.path.exists(listener.path)
        # The live ones still serve.
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(live.getsockname())
        probe.close()
    finally:
        listener.close()
        for sock in [live, busy, *waiting]:
            sock.close()
        shutil.rmtree(outside)


def test_a_start_probes_a_bounded_number_of_sockets_and_later_starts_the_rest(directory):
    dead = [_dead(_name(directory, f"killed-{i}")) for i in range(_SWEEP_MAX + 40)]

    def left() -> int:
        return sum(os.path.lexists(path) for path in dead)

    StageListener(_name(directory, "first"), lambda *order: None).close()
    assert left() == 40
    StageListener(_name(directory, "second"), lambda *order: None).close()
    assert left() == 0
