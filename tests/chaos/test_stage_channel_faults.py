"""The stage channel against peers that do not read, lie, stall or flood it.

Each test drives the real listener (a worker's end) or client (the
scheduler's end) over a real Unix socket, with the other end a raw socket
doing the damage. "Returns" means within a generous liveness bound (seconds),
never a timing claim. Cost: about 2 s for the file.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from lmcache_ec.integration.vllm.channel import StageListener
from lmcache_ec.integration.vllm.stage_client import StageClient
from lmcache_ec.integration.vllm.stage_frames import ChannelLimits
from lmcache_ec.integration.vllm.stage_messages import (
    StageAnswer,
    WeightsAnnouncement,
    WorkerReport,
)
from lmcache_ec.runtime_dirs import socket_path

LIVE_S = 10.0  # a call that has not returned by then is blocked, not slow
HELLO = WeightsAnnouncement("w1")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _frame(body: bytes) -> bytes:
    return struct.pack("!i", len(body)) + body


def _ids(count: int) -> tuple[str, ...]:
    return tuple(f"{i:064x}" for i in range(count))


@pytest.fixture
def path() -> Iterator[str]:
    path = socket_path(f"chaos-{os.getpid()}-{time.monotonic_ns()}", 0, 0)
    yield path
    if os.path.exists(path):
        os.unlink(path)


def _answering(identifiers, weights, link, rows) -> None:
    link.answer(staged=identifiers, failed=[], weights=weights)


def _raw(path: str) -> socket.socket:
    peer = socket.socket(socket.AF_UNIX)
    peer.connect(path)
    return peer


def _closed_by_peer(peer: socket.socket, within: float = 5.0) -> bool:
    """True once the other end closed ``peer`` (whatever it sent before)."""
    peer.settimeout(0.1)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if not peer.recv(1 << 16):
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def _hello_of(peer: socket.socket, within: float = 5.0) -> bytes | None:
    """The first frame's body ``peer`` receives (None: closed or nothing)."""
    peer.settimeout(within)
    data = b""
    try:
        while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
            chunk = peer.recv(1 << 16)
            if not chunk:
                return None
            data += chunk
    except TimeoutError:
        return None
    return data[4 : 4 + struct.unpack("!I", data[:4])[0]]


def _until(predicate, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _returns(call, within: float = LIVE_S) -> tuple[bool, object]:
    """(whether ``call()`` returned within ``within`` s, its result)."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(within)
    return (not thread.is_alive(), result[0] if result else None)


def _receive_until(client: StageClient, count: int, within: float = 5.0) -> list:
    messages: list = []
    deadline = time.monotonic() + within
    while len(messages) < count and time.monotonic() < deadline:
        messages += client.receive(timeout=0.1)
    return messages


def _warnings(caplog, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and text in r.getMessage()
    ]


# -- sending never blocks the step -------------------------------------------


def test_a_peer_that_never_reads_never_blocks_a_step_or_a_new_scheduler(path, caplog):
    """Reports to a peer that stopped reading queue up to a bound, then its link
    is dropped; the step never waits, and a new scheduler still gets its hello."""
    limits = ChannelLimits(outbox_bytes=512 * 1024)
    listener = StageListener(path, _answering, hello=lambda: HELLO, limits=limits)
    hostile = _raw(path)
    try:
        assert _until(lambda: listener.connected)
        report = WorkerReport(_ids(20), (), (), {"puts": 1.0}, "w1")  # ~1.5 KB, as a step's

        def steps() -> None:
            for _ in range(2000):
                listener.broadcast(report)

        returned, _ = _returns(steps)
        assert returned, "a broadcast blocked on a peer that does not read"
        client = StageClient([path])
        assert client.connect()
        assert _receive_until(client, 1) == [HELLO]
        assert _closed_by_peer(hostile)  # dropped once it fell behind ...
        assert listener.take_counts() == {"channel_slow_links": 1}  # ... and counted
        assert _until(lambda: len(_warnings(caplog, "stopped reading")) == 1)
        client.close()
    finally:
        hostile.close()
        listener.close()


def test_a_report_larger_than_the_socket_buffer_never_waits_for_the_scheduler(path):
    """The scheduler reads a step's report only after the step: the worker must
    not wait for it to read, or the two wait for each other."""
    listener = StageListener(path, _answering, hello=lambda: HELLO)
    client = StageClient([path])
    try:
        assert client.connect()
        assert _receive_until(client, 1) == [HELLO]
        report = WorkerReport(_ids(5000), (), (), {}, "w1")  # ~350 KB: over the socket buffer
        returned, taken = _returns(lambda: listener.broadcast(report))
        assert returned and taken
        assert _receive_until(client, 1) == [report]
    finally:
        client.close()
        listener.close()


def test_orders_never_block_on_a_worker_that_does_not_read(path):
    """The scheduler's orders to a rank that stopped reading: never a blocked
    step; past the bound the channel is dropped (orders go with step metadata)."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)  # connections complete; nothing is ever read
    client = StageClient([path], limits=ChannelLimits(outbox_bytes=1024 * 1024))
    try:
        assert client.connect()

        def orders() -> list[bool]:
            return [client.send(list(_ids(5000)), "w1") and client.flush() for _ in range(20)]

        returned, sent = _returns(orders)
        assert returned, "an order blocked on a worker that does not read"
        assert sent[0] and not sent[-1] and not client.connected
        assert client.take_counts() == {"channel_breaks": 1}
    finally:
        client.close()
        server.close()


def test_a_break_hands_back_only_the_releases_a_worker_never_got(path):
    """A release left in the outbox by a break goes out again (a worker would
    hold its copy for good); one already written does not (sent again, it
    could drop a copy the scheduler promised since)."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    client = StageClient([path], limits=ChannelLimits(outbox_bytes=8 * 1024 * 1024))
    try:
        assert client.connect()
        peer, _ = server.accept()
        assert client.send_release(["written"]) and client.flush()
        outbox = client._ranks[0].outbox
        while not outbox.bytes:  # orders nobody reads fill the socket
            assert client.send(list(_ids(5000)), "w1") and client.flush()
        assert client.send_release(["kept-back"]) and client.flush()
        peer.close()
        _receive_until(client, 1, within=1.0)  # finds the worker gone: breaks
        assert not client.connected
        assert client.take_lost_releases() == ["kept-back"]
        assert client.take_lost_releases() == []
    finally:
        client.close()
        server.close()


# -- bad frames close their link, and only it --------------------------------

_DEEP = b"[" * 20_000 + b"]" * 20_000

BAD_FRAMES_TO_A_WORKER = {
    "400-digit-int": _frame(b'{"stats":{"n":' + b"9" * 400 + b"}}"),
    "400-digit-int-in-an-order": _frame(
        b'{"kind":"stage","ids":[' + b"9" * 400 + b'],"weights":""}'
    ),
    "deep-nesting": _frame(_DEEP),
    "2^62-length-header": struct.pack("!i", -1) + struct.pack("!Q", 2**62),
    "over-the-size-limit": struct.pack("!I", 64 * 1024 * 1024) + b"{",
    "not-an-object": _frame(b"[1, 2]"),
    "not-json": _frame(b"not json \xff"),
    "wrong-types": _frame(b'{"kind":"stage","ids":"abc","weights":""}'),
    "not-finite": _frame(b'{"kind":"stage","ids":[],"weights":NaN}'),
    "extra-field": _frame(b'{"kind":"stage","ids":[],"weights":"","also":[]}'),
    "not-an-order": _frame(b'{"kind":"answer","staged":[],"failed":[],"weights":""}'),
    "rows-not-positive": _frame(b'{"kind":"stage","ids":["a"],"weights":"","rows":{"a":0}}'),
    "rows-not-counts": _frame(b'{"kind":"stage","ids":["a"],"weights":"","rows":{"a":true}}'),
}


@pytest.mark.parametrize("frame", BAD_FRAMES_TO_A_WORKER.values(), ids=BAD_FRAMES_TO_A_WORKER)
def test_a_bad_frame_closes_only_its_link_on_the_worker(path, frame, caplog):
    orders: list[list[str]] = []

    def on_order(identifiers, weights, link, rows):
        orders.append(identifiers)
        _answering(identifiers, weights, link, rows)

    # Frames in progress may wait a minute: each bad frame must be refused on sight.
    patient = ChannelLimits(frame_deadline_s=60.0)
    listener = StageListener(path, on_order, hello=lambda: HELLO, limits=patient)
    good = StageClient([path])
    bad = _raw(path)
    try:
        assert good.connect()
        assert _receive_until(good, 1) == [HELLO]
        bad.sendall(frame)
        assert _closed_by_peer(bad), "the link that sent a bad frame stayed open"
        # The other link is untouched and served.
        assert good.send(["a"], "w1")
        assert _receive_until(good, 1) == [StageAnswer(("a",), (), "w1")]
        assert orders == [["a"]]
        # Closed links are forgotten: with the good one gone, nobody is connected,
        # so the worker's reports go with step metadata again.
        good.close()
        assert _until(lambda: not listener.connected)
        assert not listener.broadcast(HELLO)
        assert listener.take_counts() == {"channel_bad_frames": 1}
        assert _until(lambda: len(_warnings(caplog, "bad frame")) == 1)
    finally:
        good.close()
        bad.close()
        listener.close()


_REPORT = b'"kind":"report","saved":[],"staged":[],"failed":[],"weights":null'

BAD_FRAMES_TO_THE_SCHEDULER = {
    "400-digit-int": _frame(b'{"report":[],"stats":{"n":' + b"9" * 400 + b"}}"),
    "400-digit-int-in-a-report": _frame(b"{" + _REPORT + b',"stats":{"n":' + b"9" * 400 + b"}}"),
    "float-overflow": _frame(b"{" + _REPORT + b',"stats":{"n":1e400}}'),
    "huge-counter": _frame(b"{" + _REPORT + b',"stats":{"n":1e300}}'),
    "boolean-counter": _frame(b"{" + _REPORT + b',"stats":{"n":true}}'),
    "deep-nesting": _frame(_DEEP),
    "2^62-length-header": struct.pack("!i", -1) + struct.pack("!Q", 2**62),
    "not-an-object": _frame(b'"weights"'),
    "not-json": _frame(b"{"),
    "wrong-types": _frame(b'{"kind":"answer","staged":"abc","failed":[],"weights":"w1"}'),
    "missing-field": _frame(b'{"kind":"answer","staged":[],"weights":"w1"}'),
    "not-for-a-scheduler": _frame(b'{"kind":"stage","ids":[],"weights":""}'),
}


@pytest.mark.parametrize(
    "frame", BAD_FRAMES_TO_THE_SCHEDULER.values(), ids=BAD_FRAMES_TO_THE_SCHEDULER
)
def test_a_bad_frame_from_a_worker_breaks_the_channel_not_the_step(path, frame, caplog):
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    client = StageClient([path], limits=ChannelLimits(frame_deadline_s=60.0))
    try:
        assert client.connect()
        worker, _ = server.accept()
        worker.sendall(frame)
        returned, messages = _returns(lambda: client.receive(timeout=1.0))
        assert returned
        assert messages == [] and not client.connected  # orders go with step metadata
        assert client.take_counts() == {"channel_breaks": 1, "channel_bad_frames": 1}
        assert _until(lambda: len(_warnings(caplog, "Stage channel broke")) == 1)
        assert _closed_by_peer(worker)
        worker.close()
    finally:
        client.close()
        server.close()


# -- a partial frame never blocks --------------------------------------------

_PARTIAL = struct.pack("!I", 100) + b'{"kind":"w'  # 10 of 100 bytes, then silence


def test_a_partial_frame_never_blocks_the_scheduler(path, caplog):
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    client = StageClient([path], limits=ChannelLimits(frame_deadline_s=0.3))
    try:
        assert client.connect()
        worker, _ = server.accept()
        worker.sendall(_PARTIAL)
        returned, messages = _returns(lambda: client.receive(timeout=0.05))
        assert returned, "receive blocked on a partial frame"
        assert messages == [] and client.connected  # a frame in progress is kept ...
        # ... until its deadline: then the channel is dropped and counted.
        assert _until(lambda: client.receive(timeout=0.05) == [] and not client.connected)
        assert client.take_counts() == {"channel_breaks": 1, "channel_bad_frames": 1}
        assert _until(lambda: len(_warnings(caplog, "stalled")) == 1)
        worker.close()
    finally:
        client.close()
        server.close()


def test_a_partial_frame_never_stops_the_worker_serving(path):
    """A link stalled mid-frame keeps its place while the worker has room
    (``test_stage_channel_partial_frames.py``: given up only when full); the
    others are served meanwhile."""
    limits = ChannelLimits(frame_deadline_s=0.3)
    listener = StageListener(path, _answering, hello=lambda: HELLO, limits=limits)
    stalled = _raw(path)
    good = StageClient([path])
    try:
        stalled.sendall(_PARTIAL)
        assert good.connect()
        assert _receive_until(good, 1) == [HELLO]
        assert good.send(["a"], "w1")
        assert _receive_until(good, 1) == [StageAnswer(("a",), (), "w1")]
        time.sleep(0.4)  # past the frame deadline: nothing to close while there is room
        assert good.send(["b"], "w1")  # still served
        assert _receive_until(good, 1) == [StageAnswer(("b",), (), "w1")]
        assert listener.take_counts() == {}
    finally:
        good.close()
        stalled.close()
        listener.close()


# -- connections: bounded, forgotten when closed, accept survives -------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_connections_are_bounded_and_closed_links_forgotten(path, caplog):
    listener = StageListener(
        path, _answering, hello=lambda: HELLO, limits=ChannelLimits(max_links=4)
    )
    peers = [_raw(path) for _ in range(4)]
    try:
        assert all(_hello_of(peer) for peer in peers)  # four links served
        assert listener.links == 4
        refused = _raw(path)
        assert _hello_of(refused) is None and _closed_by_peer(refused)
        refused.close()
        assert listener.take_counts() == {"channel_refused_links": 1}
        assert _until(lambda: len(_warnings(caplog, "refusing")) == 1)
        # Closed links are forgotten: their places serve new connections, and
        # connecting and leaving many times leaks no descriptor and no thread.
        for peer in peers[:2]:
            peer.close()
        assert _until(lambda: listener.links == 2)
        threads, fds = threading.active_count(), _open_fds()
        for _ in range(100):
            peer = _raw(path)
            assert _hello_of(peer)
            peer.close()
            assert _until(lambda: listener.links == 2)
        assert _until(lambda: _open_fds() == fds)
        assert threading.active_count() == threads
        replacements = [_raw(path) for _ in range(2)]
        assert all(_hello_of(peer) for peer in replacements)
        peers[2:] += replacements
        assert listener.take_counts() == {}
    finally:
        for peer in peers:
            peer.close()
        listener.close()


# A child script's lines that leave its process no descriptor (``held`` keeps them).
_EXHAUST_DESCRIPTORS = textwrap.dedent(
    """
    highest = max(map(int, os.listdir("/proc/self/fd")))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 8, hard))
    held = []
    try:
        while True:
            held.append(os.dup(0))
    except OSError:
        pass
    """
)

_FULL_PROCESS = (
    textwrap.dedent(
        """
    import json, os, resource, sys, time
    from lmcache_ec.integration.vllm.channel import StageListener
    from lmcache_ec.integration.vllm.stage_messages import WeightsAnnouncement

    listener = StageListener(sys.argv[1], lambda *order: None, lambda: WeightsAnnouncement("w1"))
    """
    )
    + _EXHAUST_DESCRIPTORS
    + textwrap.dedent(
        """
    print("full", flush=True)
    sys.stdin.readline()  # the parent has connected: the accept meets EMFILE
    counts = {}
    deadline = time.monotonic() + 5
    while not counts.get("channel_accept_errors") and time.monotonic() < deadline:
        for name, value in listener.take_counts().items():
            counts[name] = counts.get(name, 0) + value
        time.sleep(0.02)
    for fd in held:
        os.close(fd)
    print(json.dumps(counts), flush=True)
    sys.stdin.readline()  # the parent has its hello
    listener.close()
    """
    )
)


def test_accept_survives_running_out_of_file_descriptors(path):
    """A worker out of descriptors cannot accept; once some are free, a
    scheduler that connected meanwhile, and any later one, get their hello."""
    child = subprocess.Popen(
        [sys.executable, "-c", _FULL_PROCESS, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        assert child.stdout.readline().strip() == "full"
        waiting = _raw(path)  # queued by the kernel; the worker cannot take it
        child.stdin.write("connected\n")
        child.stdin.flush()
        counts = json.loads(child.stdout.readline())
        assert _hello_of(waiting), "the connection waiting through EMFILE was never served"
        later = _raw(path)
        assert _hello_of(later)
        assert counts.get("channel_accept_errors", 0) >= 1
        waiting.close()
        later.close()
        child.stdin.write("done\n")
        child.stdin.flush()
        assert child.wait(10) == 0
    finally:
        child.kill()
        child.wait()


_CLIENT_AT_THE_LIMIT = (
    textwrap.dedent(
        """
    import os, resource, sys, time
    from lmcache_ec.integration.vllm.channel import StageListener
    from lmcache_ec.integration.vllm.stage_client import StageClient
    from lmcache_ec.integration.vllm.stage_messages import WeightsAnnouncement

    listener = StageListener(sys.argv[1], lambda *order: None, lambda: WeightsAnnouncement("w1"))
    client = StageClient([sys.argv[1]])
    assert client.connect()
    client.receive(timeout=1.0)  # the hello
    """
    )
    + _EXHAUST_DESCRIPTORS
    + textwrap.dedent(
        """
    started = time.monotonic()
    client.receive(timeout=0.2)  # nothing comes: it waits, as in a scheduler step
    print("waited", time.monotonic() - started >= 0.15, flush=True)
    """
    )
)


def test_the_scheduler_waits_for_answers_at_its_descriptor_limit(path):
    """A wait for the workers' answers takes no descriptor: a scheduler whose
    process has none left still waits within its step (an epoll selector per
    wait raised EMFILE out of vLLM's schedule())."""
    child = subprocess.run(
        [sys.executable, "-c", _CLIENT_AT_THE_LIMIT, path],
        capture_output=True,
        text=True,
        timeout=LIVE_S * 3,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == ["waited", "True"]
