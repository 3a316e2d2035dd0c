"""A frame in progress on the stage channel: waiting for its rest is no fault.

The scheduler writes what the socket takes of a large order at the end of a
step, and the rest only when it runs again; an idle engine may not run for
minutes. The worker keeps such a link, and closes a link whose frame stalled
only when its place is asked for (the worker serves ``max_links`` already).
The scheduler, for its part, reads a worker's large frame over as many reads
as it takes, however long it did not read between two.

Each test drives the real listener (a worker's end) or client (the
scheduler's end) over a real Unix socket; "past the deadline" is a short
sleep beyond a deadline of 0.3 s. Cost: about 2 s for the file.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from lmcache_ec.integration.vllm.channel import StageListener
from lmcache_ec.integration.vllm.stage_client import StageClient
from lmcache_ec.integration.vllm.stage_frames import ChannelLimits
from lmcache_ec.integration.vllm.stage_messages import (
    TO_SCHEDULER,
    StageAnswer,
    StageOrder,
    WeightsAnnouncement,
    WorkerReport,
    decode,
    encode,
)
from lmcache_ec.runtime_dirs import socket_path
from tests.chaos.test_stage_channel_faults import _answering, _closed_by_peer, _receive_until

HELLO = WeightsAnnouncement("w1")
DEADLINE_S = 0.3
PAST_THE_DEADLINE_S = 0.6


def _ids(count: int) -> tuple[str, ...]:
    return tuple(f"{i:064x}" for i in range(count))


@pytest.fixture
def path() -> Iterator[str]:
    path = socket_path(f"partial-{os.getpid()}-{time.monotonic_ns()}", 0, 0)
    yield path
    if os.path.exists(path):
        os.unlink(path)


def _exactly(peer: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = peer.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _next_message(peer: socket.socket, within: float = 5.0):
    """The next message ``peer`` receives (None: closed, or nothing in time)."""
    peer.settimeout(within)
    try:
        header = _exactly(peer, 4)
        body = header and _exactly(peer, struct.unpack("!I", header)[0])
    except (TimeoutError, ConnectionResetError):
        return None
    return None if body is None else decode(body, TO_SCHEDULER)


def test_an_order_an_idle_scheduler_left_half_written_is_served_when_it_writes_the_rest(path):
    listener = StageListener(
        path, _answering, hello=lambda: HELLO, limits=ChannelLimits(frame_deadline_s=DEADLINE_S)
    )
    scheduler = socket.socket(socket.AF_UNIX)
    newcomer = StageClient([path])
    try:
        scheduler.connect(path)
        assert _next_message(scheduler) == HELLO
        order = encode(StageOrder(_ids(4000), "w1"))  # more than a socket buffer takes
        scheduler.sendall(order[: len(order) // 2])  # the end of a step; then idle
        time.sleep(PAST_THE_DEADLINE_S)
        # Another connection wakes the worker's thread: still room, nothing is closed.
        assert newcomer.connect()
        assert _receive_until(newcomer, 1) == [HELLO]
        scheduler.sendall(order[len(order) // 2 :])  # the next step
        assert _next_message(scheduler) == StageAnswer(_ids(4000), (), "w1")
        assert listener.links == 2
        assert listener.take_counts() == {}
    finally:
        newcomer.close()
        scheduler.close()
        listener.close()


def test_a_stalled_frame_gives_its_place_up_to_a_new_scheduler_when_the_worker_is_full(path):
    limits = ChannelLimits(frame_deadline_s=DEADLINE_S, max_links=2)
    listener = StageListener(path, _answering, hello=lambda: HELLO, limits=limits)
    stalled = socket.socket(socket.AF_UNIX)
    good = StageClient([path])
    newcomer = StageClient([path])
    try:
        stalled.connect(path)
        assert _next_message(stalled) == HELLO
        stalled.sendall(struct.pack("!I", 100) + b'{"kind":"s')  # 10 of 100 bytes, then silence
        assert good.connect()
        assert _receive_until(good, 1) == [HELLO]
        time.sleep(PAST_THE_DEADLINE_S)
        assert newcomer.connect()
        assert _receive_until(newcomer, 1, within=2.0) == [HELLO]  # served, not refused
        assert _closed_by_peer(stalled)
        assert listener.take_counts() == {"channel_bad_frames": 1}
        assert good.send(["a"], "w1")  # the other link is untouched
        assert _receive_until(good, 1) == [StageAnswer(("a",), (), "w1")]
    finally:
        newcomer.close()
        good.close()
        stalled.close()
        listener.close()


def test_a_large_report_read_across_an_idle_scheduler_step_arrives_whole(path):
    listener = StageListener(path, _answering, hello=lambda: HELLO)
    client = StageClient([path], limits=ChannelLimits(frame_deadline_s=DEADLINE_S))
    try:
        assert client.connect()
        assert _receive_until(client, 1) == [HELLO]
        # About 4 MB: several of the scheduler's reads (1 MiB each) whatever the timing.
        report = WorkerReport(_ids(60_000), (), (), {}, "w1")
        assert listener.broadcast(report)
        assert client.receive(0.0) == []  # the first part: then the engine is idle
        time.sleep(PAST_THE_DEADLINE_S)
        assert _receive_until(client, 1) == [report]
        assert client.connected
        assert client.take_counts() == {}
    finally:
        client.close()
        listener.close()
