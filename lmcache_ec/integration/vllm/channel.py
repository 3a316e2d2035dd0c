"""Stage orders from the scheduler straight to the workers, and their answers back.

vLLM hands connector metadata to workers only inside a model-runner step, and
Model Runner V1 skips every EC connector hook in a step with no scheduled
tokens. A request deferred while its encoder outputs are staged is exactly such
a step when the engine is otherwise idle, so an order riding in step metadata
would never arrive. This channel carries stage orders and staging results over
one Unix socket per rank (each first-stage worker: tensor x prefill-context
parallel), independent of the runner's steps.

- Worker: ``StageListener`` binds ``<runtime dir>/<engine>-<digest>-dp<d>-tp<r>.sock``
  (``runtime_dirs.socket_path``: named anew at each launch; a starting worker
  removes the ones there nobody listens on) and hands each order to a
  callback; the callback answers through ``StageLink.answer`` once the items
  are staged (or not). It also tells the scheduler the weights fingerprint
  its keys use: on connect and after every change (``broadcast``, queued
  before the call that changed the weights returns, so it precedes every
  later message on the link).
- Scheduler: ``StageClient`` connects to every rank, sends orders without
  blocking on the answer, and polls (or briefly waits for) messages.

The messages (``stage_messages.py``): ``StageOrder`` and ``ReleaseOrder``
(scheduler → worker),
``StageAnswer``, ``WeightsAnnouncement`` and ``WorkerReport`` (worker →
scheduler; the report is the step's worker metadata, sent here because vLLM
drops worker metadata in some steps: V1 idle steps, and every step of an
encode-only instance). Orders and answers carry the weights version they were
made under, so none crosses a weight update.

Neither side ever waits on a peer (``ChannelLimits``):

- Sockets are non-blocking. A sender writes what the socket takes and keeps
  the rest in the link's outbox, bounded in bytes; on the worker one thread
  (``ec-stage-channel``) writes outboxes, accepts and reads, so the model
  step that sends a report only queues it. A link whose outbox overflows has
  fallen behind: it is closed and counted (``channel_slow_links``).
- A frame has a size limit; a bad frame (too large, not JSON, not a known
  message) closes the link it came on, and only that one
  (``channel_bad_frames``). A closed link is forgotten at once. A frame in
  progress may wait for its rest: the scheduler writes what the socket takes
  of a large order and the rest when its engine next runs, which an idle
  engine may not do for long. A frame that got no byte for ``frame_deadline_s``
  has stalled: the scheduler drops the channel then; a worker closes the link
  only when a new connection finds no room.
- A worker serves at most ``max_links`` connections (more are refused:
  ``channel_refused_links``); a failed accept (out of file descriptors, say)
  pauses accepting briefly and is retried (``channel_accept_errors``).
- The scheduler reads only what has arrived, waiting at most the time it is
  given; a channel that breaks is dropped (orders go with step metadata) and
  tried again after ``StageClient.RETRY_S``.

Each fault is logged once a minute at most (a WARNING), and counted.

Frames are JSON (never pickle), and the socket lives in a directory only this
user can enter. Where a rank cannot be reached (another node, a bind refused),
the scheduler falls back to step metadata.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import re
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable

from .stage_frames import DEFAULT_LIMITS, ChannelFaults, ChannelLimits, FrameReader, Outbox
from .stage_messages import (
    TO_WORKER,
    BadFrame,
    Message,
    ReleaseOrder,
    StageAnswer,
    StageOrder,
    decode,
    encode,
)

logger = logging.getLogger(__name__)


class Delivery(enum.Enum):
    QUEUED = "queued"  # written, or queued for the channel's thread to write
    SLOW = "slow"  # the peer has not read enough of what it was sent: dropped
    GONE = "gone"  # the link is closed


class StageLink:
    """One scheduler connection on the worker side; answers may come from any thread."""

    def __init__(self, sock: socket.socket, owner: StageListener) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.reader = FrameReader(owner.limits.frame_deadline_s)
        self.watching_writes = False  # the channel's thread only
        self._owner = owner
        self._outbox = Outbox(owner.limits.outbox_bytes)
        self._lock = threading.Lock()  # the outbox and the socket's writes
        self._closed = False

    def answer(self, staged: Iterable[str], failed: Iterable[str], weights: str) -> None:
        self.send(StageAnswer(tuple(staged), tuple(failed), weights))

    def send(self, message: Message) -> bool:
        """Queue ``message``; never waits on the peer. False if this link is gone."""
        try:
            frame = encode(message)
        except BadFrame as exc:
            self._owner.faults.warn("encode", "Stage message not sent: %s", exc)
            return False
        return self._owner.deliver(self, frame)

    def push(self, frame: bytes) -> Delivery:
        """Queue ``frame`` and write what the socket takes at once."""
        with self._lock:
            if self._closed:
                return Delivery.GONE
            if not self._outbox.add(frame):
                return Delivery.SLOW
            try:
                self._outbox.write(self.sock)
            except OSError:
                return Delivery.GONE
        return Delivery.QUEUED

    def flush(self) -> bool:
        """Write what the socket takes now; False if the peer is gone."""
        with self._lock:
            if self._closed:
                return False
            try:
                self._outbox.write(self.sock)
            except OSError:
                return False
            return True

    @property
    def pending(self) -> bool:
        return self._outbox.bytes > 0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()


_ACCEPT = "accept"
_WAKE = "wake"


class StageListener:
    """Worker side: accept schedulers' connections, pass their orders on, send them messages.

    ``on_order(ids, weights, link, rows)`` and ``on_release(ids)`` run on the
    channel's thread and must not block; ``hello()`` gives each new link its
    first message.
    """

    def __init__(
        self,
        path: str,
        on_order: Callable[[list[str], str, StageLink, dict[str, int]], None],
        hello: Callable[[], Message | None] = lambda: None,
        limits: ChannelLimits = DEFAULT_LIMITS,
        on_release: Callable[[list[str]], None] = lambda ids: None,
    ) -> None:
        self.path = path
        self.limits = limits
        self.faults = ChannelFaults()
        self._on_order = on_order
        self._on_release = on_release
        self._hello = hello
        # Registered links by descriptor. Reentrant: a failed hello or broadcast
        # drops its link while the lock is held.
        self._links: dict[int, StageLink] = {}
        self._lock = threading.RLock()
        self._doomed: list[StageLink] = []  # dropped, to be closed by the channel's thread
        self._closed = False
        self._accept_paused_until: float | None = None
        self._backoff = limits.accept_backoff_s
        _remove_stale(path)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._server.bind(path)
            os.chmod(path, 0o600)
            self._server.listen(limits.backlog)
        except OSError:
            self._server.close()
            raise
        self._server.setblocking(False)
        _remove_dead_sockets(os.path.dirname(path), path)
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ, _ACCEPT)
        self._selector.register(self._wake_in, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._run, name="ec-stage-channel", daemon=True)
        self._thread.start()

    @property
    def connected(self) -> bool:
        """True while a scheduler is connected."""
        with self._lock:
            return bool(self._links)

    @property
    def links(self) -> int:
        """Connections served now."""
        with self._lock:
            return len(self._links)

    def take_counts(self) -> dict[str, float]:
        """Fault counters since the last call (``channel_*``)."""
        return self.faults.take()

    def broadcast(self, message: Message) -> bool:
        """Queue ``message`` for every connected scheduler; never waits on one.

        Under the same lock as a new link's hello: whichever comes last on a
        link is the newest state. False if no link took it.
        """
        try:
            frame = encode(message)
        except BadFrame as exc:
            self.faults.warn("encode", "Stage message not sent: %s", exc)
            return False
        with self._lock:
            taken = [self.deliver(link, frame) for link in list(self._links.values())]
        return any(taken)

    def deliver(self, link: StageLink, frame: bytes) -> bool:
        """Queue ``frame`` on ``link``; a link that fell behind is dropped."""
        delivery = link.push(frame)
        if delivery is Delivery.QUEUED:
            if link.pending:
                self._wake()  # the channel's thread writes the rest
            return True
        slow = delivery is Delivery.SLOW
        if self._drop(link, "channel_slow_links" if slow else None) and slow:
            self.faults.warn(
                "slow",
                "Stage channel: dropped a link whose peer stopped reading (%d bytes unsent)",
                self.limits.outbox_bytes,
            )
        return False

    def _drop(self, link: StageLink, fault: str | None = None) -> bool:
        """Forget ``link`` at once (the channel's thread closes it), counting
        ``fault`` before its peer can see it closed; False if it was forgotten."""
        with self._lock:
            registered = self._links.get(link.fd) is link
            if registered:
                del self._links[link.fd]
                if fault is not None:
                    self.faults.count(fault)
                self._doomed.append(link)
        self._wake()
        return registered

    def _bad_frame(self, link: StageLink, why: object) -> None:
        if self._drop(link, "channel_bad_frames"):
            self.faults.warn(
                "bad frame", "Stage channel: closed a link that sent a bad frame: %s", why
            )

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: a wake-up is pending anyway
            self._wake_out.send(b"\0")

    # -- the channel's thread ------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closed:
                try:
                    self._turn()
                except Exception as exc:  # never let the channel end silently
                    self.faults.warn("internal", "Stage channel: unexpected error: %r", exc)
                    time.sleep(0.05)
        finally:
            self._shut_down()

    def _turn(self) -> None:
        self._close_doomed()
        with self._lock:
            links = list(self._links.values())
        for link in links:
            if link.pending != link.watching_writes:
                link.watching_writes = link.pending
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if link.pending else 0)
                self._selector.modify(link.sock, events, link)
        events = self._selector.select(self._select_timeout())
        now = time.monotonic()
        for key, mask in events:
            if key.data is _WAKE:
                with contextlib.suppress(OSError):
                    self._wake_in.recv(4096)
            elif key.data is _ACCEPT:
                self._accept(now)
            else:
                self._serve(key.data, mask, now)
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self._server, selectors.EVENT_READ, _ACCEPT)

    def _select_timeout(self) -> float:
        if self._accept_paused_until is None:
            return 1.0
        return min(1.0, max(0.0, self._accept_paused_until - time.monotonic()) + 0.001)

    def _accept(self, now: float) -> None:
        for _ in range(self.limits.max_links + 1):  # a batch, then others' turn
            try:
                sock, _ = self._server.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of descriptors or memory: pause, then retry
                self.faults.count("channel_accept_errors")
                self.faults.warn(
                    "accept",
                    "Stage channel: accept failed (%s); retrying in %.2f s",
                    exc,
                    self._backoff,
                )
                self._selector.unregister(self._server)
                self._accept_paused_until = now + self._backoff
                self._backoff = min(1.0, 2 * self._backoff)
                return
            self._backoff = self.limits.accept_backoff_s
            with self._lock:
                full = len(self._links) >= self.limits.max_links
            if full and not self._free_stalled(now):
                self.faults.count("channel_refused_links")
                self.faults.warn(
                    "refused",
                    "Stage channel: refusing a connection (%d links open)",
                    self.limits.max_links,
                )
                sock.close()
                continue
            sock.setblocking(False)
            link = StageLink(sock, self)
            self._selector.register(sock, selectors.EVENT_READ, link)
            with self._lock:
                self._links[link.fd] = link
                hello = self._hello()
                if hello is not None:
                    link.send(hello)

    def _free_stalled(self, now: float) -> bool:
        """Close the links whose frame stalled past its deadline; whether a new
        link fits then. Only when the worker is full: a stalled frame costs
        nothing until its place is asked for, and the scheduler's own order may
        rightly wait half written while its engine is idle (nothing runs the
        hooks that write the rest)."""
        with self._lock:
            stalled = [link for link in self._links.values() if link.reader.overdue(now)]
        for link in stalled:
            self._bad_frame(link, f"a frame stalled for {link.reader.deadline_s} s")
        with self._lock:
            return len(self._links) < self.limits.max_links

    def _serve(self, link: StageLink, mask: int, now: float) -> None:
        if mask & selectors.EVENT_WRITE and not link.flush():
            self._drop(link)
            return
        if not mask & selectors.EVENT_READ:
            return
        try:
            frames, closed = link.reader.read(link.sock, now)
            orders = [decode(body, TO_WORKER) for body in frames]
        except BadFrame as exc:
            self._bad_frame(link, exc)
            return
        except OSError:
            closed, orders = True, []
        for order in orders:
            try:
                if isinstance(order, ReleaseOrder):
                    self._on_release(list(order.ids))
                else:
                    assert isinstance(order, StageOrder)
                    self._on_order(list(order.ids), order.weights, link, dict(order.rows))
            except Exception as exc:  # the worker's bug, not the peer's: keep the link
                self.faults.warn("order", "Stage order not handled: %r", exc)
        if closed:
            self._drop(link)

    def _close_doomed(self) -> None:
        with self._lock:
            doomed, self._doomed = self._doomed, []
        for link in doomed:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(link.sock)
            link.close()

    def _shut_down(self) -> None:
        with self._lock:
            self._doomed.extend(self._links.values())
            self._links.clear()
        self._close_doomed()
        self._selector.close()
        for sock in (self._server, self._wake_in, self._wake_out):
            sock.close()

    def close(self, timeout: float = 2.0) -> None:
        """Stop accepting and serving; close every link."""
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._thread.join(timeout)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _remove_stale(path: str) -> None:
    """Unlink a socket file nobody listens on; refuse to take a live one over."""
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX)
    probe.setblocking(False)  # a listener with a full backlog answers EAGAIN: live
    try:
        probe.connect(path)
    except BlockingIOError:
        pass
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise OSError(f"{path}: another process listens there")


# A stage socket's name: ``runtime_dirs.socket_path``'s, or an older version's
# ``<engine id>-dp<d>-tp<r>.sock``.
_SOCKET_NAME = re.compile(r"[A-Za-z0-9_-]+-dp[0-9]+-tp[0-9]+\.sock")
_SWEEP_MAX = 256  # sockets probed at one start; more wait for later starts
# Younger sockets are left alone: one may be bound and not listening yet.
_SWEEP_MIN_AGE_S = 10.0


def _remove_dead_sockets(directory: str, own: str) -> None:
    """Unlink the stage sockets in ``directory`` that refuse connections: each
    engine's are named anew at each launch, so those of an engine killed are
    never bound again. Only a socket file (never a link) nobody listens on."""
    removed = probed = 0
    old = time.time() - _SWEEP_MIN_AGE_S
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if probed >= _SWEEP_MAX:
                    break
                if entry.path == own or not _SOCKET_NAME.fullmatch(entry.name):
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISSOCK(info.st_mode) and info.st_mtime < old:
                    probed += 1
                    removed += _unlink_if_refused(entry.path)
    except OSError as exc:
        logger.debug("Stage sockets in %s not swept: %s", directory, exc)
    if removed:
        logger.info("Removed %d stage sockets nobody listens on from %s", removed, directory)


def _unlink_if_refused(path: str) -> bool:
    """Unlink ``path`` if connecting to it is refused (its listener is gone)."""
    probe = socket.socket(socket.AF_UNIX)
    probe.setblocking(False)  # a live listener with a full backlog: EAGAIN
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        pass
    except OSError:
        return False  # live (EAGAIN: a full backlog), or not ours to judge
    else:
        return False  # live
    finally:
        probe.close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False  # another start removed it first
    return True
