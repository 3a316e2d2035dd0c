"""Frames over a non-blocking Unix socket, for both ends of the stage channel.

``Outbox`` holds what a sender could not write yet, bounded in bytes;
``FrameReader`` reassembles frames from whatever bytes have arrived, refuses
one announced over ``FRAME_MAX_BYTES`` and tells one that stalled (no byte of
it read for its deadline); ``ChannelFaults`` counts each end's faults and logs
each kind at most once a minute. ``ChannelLimits`` holds the bounds (see
``channel.py``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass

from .stage_messages import FRAME_MAX_BYTES, HEADER, BadFrame

logger = logging.getLogger("lmcache_ec.integration.vllm.channel")


@dataclass(frozen=True)
class ChannelLimits:
    max_links: int = 8  # connections one worker serves at once
    outbox_bytes: int = 2 * FRAME_MAX_BYTES  # unsent bytes a link may hold before it is dropped
    frame_deadline_s: float = 5.0  # a frame in progress that gets no byte for this long stalled
    backlog: int = 16
    accept_backoff_s: float = 0.05  # the first pause after a failed accept; doubles up to 1 s


DEFAULT_LIMITS = ChannelLimits()


_READ_CHUNK = 256 * 1024
_COALESCE_BYTES = 256 * 1024
_WARN_INTERVAL_S = 60.0


class ChannelFaults:
    """Counters of one end of the channel, and its warnings: one per fault per minute."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, float] = {}
        self._warned: dict[str, float] = {}

    def count(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + amount

    def warn(self, fault: str, message: str, *args: object) -> None:
        """Log ``message`` at WARNING, unless ``fault`` was logged in the last minute."""
        now = time.monotonic()
        with self._lock:
            due = now - self._warned.get(fault, -_WARN_INTERVAL_S) >= _WARN_INTERVAL_S
            if due:
                self._warned[fault] = now
        (logger.warning if due else logger.debug)(message, *args)

    def take(self) -> dict[str, float]:
        with self._lock:
            counts, self._counts = self._counts, {}
        return counts


class Outbox:
    """Frames waiting for a non-blocking socket, bounded in bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0  # not yet written
        self._frames: deque[bytes] = deque()
        self._offset = 0  # into the first frame
        self._added = 0  # bytes over the outbox's life
        self._written = 0
        self._tags: deque[tuple[int, tuple[str, ...]]] = deque()  # (end, tag), not written

    def add(self, frame: bytes, tag: tuple[str, ...] = ()) -> bool:
        """False (and nothing queued) if ``frame`` does not fit; a ``tag`` stays in
        ``unsent`` until the whole frame is written."""
        if self.bytes + len(frame) > self.limit:
            return False
        self._frames.append(frame)
        self.bytes += len(frame)
        self._added += len(frame)
        if tag:
            self._tags.append((self._added, tag))
        return True

    def unsent(self) -> list[tuple[str, ...]]:
        """The tags of frames not wholly written (a peer never reads half a frame)."""
        return [tag for _, tag in self._tags]

    def write(self, sock: socket.socket) -> None:
        """Write what the socket takes now; ``OSError`` if the peer is gone."""
        while self._frames:
            if len(self._frames) > 1 and self._offset == 0:
                self._coalesce()
            frame = self._frames[0]
            try:
                sent = sock.send(memoryview(frame)[self._offset :])
            except BlockingIOError:
                return
            self._offset += sent
            self.bytes -= sent
            self._written += sent
            while self._tags and self._tags[0][0] <= self._written:
                self._tags.popleft()
            if self._offset == len(frame):
                self._frames.popleft()
                self._offset = 0

    def _coalesce(self) -> None:
        """Join the first frames into one write: a system call (and a turn of
        the GIL) per frame costs more than the copy."""
        parts: list[bytes] = []
        size = 0
        while self._frames and size < _COALESCE_BYTES:
            parts.append(self._frames.popleft())
            size += len(parts[-1])
        self._frames.appendleft(b"".join(parts))


class FrameReader:
    """Frame bodies out of a non-blocking socket, and whether the one in progress stalled.

    A stall counts from the last read that brought bytes of the frame, not from
    its first: a reader that did not read for a while (an idle scheduler) finds
    the rest waiting, and a large frame arrives over many reads.
    """

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self._buffer = bytearray()
        self._since: float | None = None  # when the frame in progress last grew

    def read(
        self,
        sock: socket.socket,
        now: float,
        *,
        max_bytes: int = 2 * FRAME_MAX_BYTES,
        max_frames: int | None = None,
    ) -> tuple[list[bytes], bool]:
        """(whole frames that arrived, whether the peer closed); ``BadFrame``, ``OSError``.

        Reads at most ``max_bytes`` from the socket and returns at most
        ``max_frames`` frames (then others have a turn): whole frames past that
        are kept, and returned first by the next call. Once the peer closed,
        every whole frame it sent is returned.
        """
        frames = self._take_frames(now, max_frames)
        while max_bytes > 0 and (max_frames is None or len(frames) < max_frames):
            try:
                data = sock.recv(min(_READ_CHUNK, max_bytes))
            except BlockingIOError:
                break
            if not data:
                return frames + self._take_frames(now, None), True
            max_bytes -= len(data)
            self._since = now
            self._buffer += data
            left = None if max_frames is None else max_frames - len(frames)
            frames.extend(self._take_frames(now, left))
        return frames, False

    def _take_frames(self, now: float, limit: int | None) -> list[bytes]:
        """Whole frames from the buffer, at most ``limit`` (None: all)."""
        frames: list[bytes] = []
        while len(self._buffer) >= HEADER.size and (limit is None or len(frames) < limit):
            (size,) = HEADER.unpack_from(self._buffer)
            if size > FRAME_MAX_BYTES:
                raise BadFrame(f"a frame of {size} bytes announced (limit {FRAME_MAX_BYTES})")
            end = HEADER.size + size
            if len(self._buffer) < end:
                break
            frames.append(bytes(self._buffer[HEADER.size : end]))
            del self._buffer[:end]
            self._since = now if self._buffer else None
        return frames

    def due(self) -> float | None:
        """When the frame in progress stalls unless more of it is read (None: none)."""
        return None if self._since is None else self._since + self.deadline_s

    def overdue(self, now: float) -> bool:
        due = self.due()
        return due is not None and now > due
