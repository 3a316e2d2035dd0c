"""The scheduler's end of the stage channel (see ``channel.py``)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import select
import socket
import time

from .stage_frames import DEFAULT_LIMITS, ChannelFaults, ChannelLimits, FrameReader, Outbox
from .stage_messages import (
    TO_SCHEDULER,
    BadFrame,
    Message,
    ReleaseOrder,
    StageAnswer,
    StageOrder,
    decode,
    encode,
)

logger = logging.getLogger("lmcache_ec.integration.vllm.channel")

# What one ``receive`` reads and decodes per rank at most (the rest waits in its
# reader for the next call): a peer that floods the channel costs a step about
# a millisecond, not a second. A step's own messages are a few frames.
_RECEIVE_BYTES = 1024 * 1024
_RECEIVE_FRAMES = 256


class _Rank:
    """The scheduler's connection to one rank."""

    def __init__(self, sock: socket.socket, limits: ChannelLimits) -> None:
        self.sock = sock
        self.reader = FrameReader(limits.frame_deadline_s)
        self.outbox = Outbox(limits.outbox_bytes)


class StageClient:
    """Scheduler side: one connection per rank; orders out, answers in.

    Used from the scheduler's thread only; no call waits on a worker longer
    than the timeout it is given.
    """

    RETRY_S = 10.0  # between connection attempts, after one failed or broke

    def __init__(self, paths: list[str], limits: ChannelLimits = DEFAULT_LIMITS) -> None:
        self.paths = paths
        self.limits = limits
        self.faults = ChannelFaults()
        self._ranks: list[_Rank] | None = None
        self._retry_at = 0.0
        # Stage orders are numbered over the client's life; a rank numbers them
        # by their place on its connection, from 1: the first of this connection
        # is number ``_first + 1``.
        self._sent = 0
        self._first = 0
        # Releases a break kept from some rank: each goes out again, before any
        # order for its item (``take_lost_releases``), or that rank keeps the copy.
        self._lost_releases: list[str] = []

    def connect(self) -> bool:
        """Connect to every rank; False (and no connection kept) if any is missing."""
        if self._ranks is not None:
            return True
        ranks: list[_Rank] = []
        try:
            for path in self.paths:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                ranks.append(_Rank(sock, self.limits))
                sock.setblocking(False)  # a full backlog fails (EAGAIN), never waits
                sock.connect(path)
        except OSError as exc:
            logger.debug("Stage channel unavailable (%s)", exc)
            for rank in ranks:
                rank.sock.close()
            return False
        self._ranks = ranks
        self._first = self._sent
        return True

    @property
    def connected(self) -> bool:
        return self._ranks is not None

    def take_counts(self) -> dict[str, float]:
        """Fault counters since the last call (``channel_*``)."""
        return self.faults.take()

    def reconnect(self) -> bool:
        """``connect``, tried at most every ``RETRY_S`` seconds after a failure."""
        now = time.monotonic()
        if self._ranks is None and now < self._retry_at:
            return False
        if self.connect():
            return True
        self._retry_at = now + self.RETRY_S
        return False

    def send(
        self, identifiers: list[str], weights: str = "", rows: dict[str, int] | None = None
    ) -> int:
        """Order every rank to stage ``identifiers`` (keyed under ``weights``, each
        of its ``rows``).

        The order is queued: it leaves with the next ``flush`` or ``receive``,
        together with the orders queued after it. Returns its number, which
        ``receive`` gives the ranks' answers to it; 0 if the channel is not
        connected or broke.
        """
        if not self._queue(StageOrder(tuple(identifiers), weights, rows or {})):
            return 0
        self._sent += 1
        return self._sent

    def send_release(self, identifiers: list[str]) -> bool:
        """Order every rank to drop its staged copies of ``identifiers``; queued
        as ``send`` is, so it reaches a rank before any order sent after it."""
        return self._queue(ReleaseOrder(tuple(identifiers)), tag=tuple(identifiers))

    def take_lost_releases(self) -> list[str]:
        """Released identifiers that a break kept from at least one rank."""
        lost, self._lost_releases = self._lost_releases, []
        return lost

    def _queue(self, message: StageOrder | ReleaseOrder, tag: tuple[str, ...] = ()) -> bool:
        if self._ranks is None:
            return False
        try:
            frame = encode(message)
        except BadFrame as exc:
            self.faults.warn("encode", "%s not sent: %s", type(message).__name__, exc)
            return False
        for rank in self._ranks:
            if not rank.outbox.add(frame, tag):
                self._break("slow", "a worker stopped reading its orders")
                return False
        return True

    def flush(self) -> bool:
        """Write queued orders as far as the sockets take them now; False if broke."""
        return self._ranks is not None and self._flush()

    def _flush(self) -> bool:
        assert self._ranks is not None
        try:
            for rank in self._ranks:
                rank.outbox.write(rank.sock)
        except OSError as exc:
            self._break("gone", str(exc))
            return False
        return True

    def receive(self, timeout: float = 0.0) -> list[Message]:
        """Messages that arrived from any rank, in order per rank.

        Waits up to ``timeout`` seconds for the first one; never blocks after
        it. A frame in progress is kept for the next call, and so are frames
        past what one call takes from a rank (``_RECEIVE_BYTES``, ``_RECEIVE_FRAMES``).
        """
        if self._ranks is None:
            return []
        deadline = time.monotonic() + timeout
        messages: list[Message] = []
        while self._flush():
            now = time.monotonic()
            for rank in self._ranks:
                try:
                    frames, closed = rank.reader.read(
                        rank.sock, now, max_bytes=_RECEIVE_BYTES, max_frames=_RECEIVE_FRAMES
                    )
                    messages.extend(self._numbered(decode(body, TO_SCHEDULER)) for body in frames)
                except BadFrame as exc:
                    self._break("bad frame", str(exc))
                    return messages
                except OSError as exc:
                    closed = True
                    logger.debug("Stage channel read failed: %s", exc)
                if closed:
                    self._break("gone", "a worker closed its end")
                    return messages
                if rank.reader.overdue(now):
                    self._break(
                        "bad frame", f"a frame stalled for {self.limits.frame_deadline_s} s"
                    )
                    return messages
            left = deadline - time.monotonic()
            if messages or left <= 0:
                return messages
            self._wait(left)
        return messages

    def _numbered(self, message: Message) -> Message:
        """An answer, with the number ``send`` gave the order it answers."""
        if isinstance(message, StageAnswer) and message.order:
            return dataclasses.replace(message, order=self._first + message.order)
        return message

    def _wait(self, seconds: float) -> None:
        """Until a rank has something to read (or can take what waits for it)."""
        assert self._ranks is not None
        # poll() takes no descriptor of its own: a process at its descriptor limit
        # still waits here (an epoll selector per wait raised EMFILE in the step).
        poller = select.poll()
        for rank in self._ranks:
            poller.register(rank.sock, select.POLLIN | (select.POLLOUT if rank.outbox.bytes else 0))
        poller.poll(max(0, math.ceil(seconds * 1000)))  # never negative: that waits for good

    def _break(self, fault: str, why: str) -> None:
        self.faults.count("channel_breaks")
        if fault == "bad frame":
            self.faults.count("channel_bad_frames")
        self.faults.warn(fault, "Stage channel broke (%s); orders go with step metadata", why)
        self.close()
        self._retry_at = time.monotonic() + self.RETRY_S

    def close(self) -> None:
        lost = dict.fromkeys(self._lost_releases)
        for rank in self._ranks or ():
            for identifiers in rank.outbox.unsent():
                lost.update(dict.fromkeys(identifiers))
            with contextlib.suppress(OSError):
                rank.sock.close()
        self._ranks = None
        self._lost_releases = list(lost)
