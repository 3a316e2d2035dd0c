"""Stage orders from the scheduler straight to the workers, and their answers back.

vLLM hands connector metadata to workers only inside a model-runner step, and
Model Runner V1 skips every EC connector hook in a step with no scheduled
tokens. A request deferred while its encoder outputs are staged is exactly such
a step when the engine is otherwise idle, so an order riding in step metadata
would never arrive. This channel carries stage orders and staging results over
one Unix socket per tensor-parallel rank, independent of the runner's steps.

- Worker: ``StageListener`` binds ``<runtime dir>/<engine>-dp<d>-tp<r>.sock``
  and hands each order to a callback; the callback answers through
  ``StageLink.answer`` once the items are staged (or not). It also tells the
  scheduler the weights fingerprint its keys use: on connect and after every
  change (``broadcast``), before the call that changed the weights returns.
- Scheduler: ``StageClient`` connects to every rank, sends orders without
  blocking on the answer, and polls (or briefly waits for) messages.

Messages are JSON objects whose values are lists of strings (``stats``: names
to numbers):

- scheduler → worker: ``{"stage": ids, "weights": [w]}``;
- worker → scheduler: ``{"staged": ids, "failed": ids, "weights": [w]}``
  answers an order; ``{"weights": [w]}`` (``[]``: unknown) announces the
  weights; ``{"report": [], "saved": ids, "staged": ids, "failed": ids,
  "stats": {...}, "weights": [w]}`` is the step's worker report, sent here
  instead of in worker metadata, which vLLM drops in some steps (V1 idle
  steps, and every step of an encode-only instance).

Orders and answers carry the weights version they were made under, so none
crosses a weight update.

Frames are JSON (never pickle), and the socket lives in a directory only this
user can enter. Where a rank cannot be reached (another node, a bind refused),
the scheduler falls back to step metadata.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any

logger = logging.getLogger(__name__)


Message = dict[str, Any]


def _encode(message: Message) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _decode(frame: bytes) -> Message:
    message = json.loads(frame)
    if not isinstance(message, dict):
        raise ValueError("stage channel: frame is not an object")
    for key, value in message.items():
        if key == "stats":
            numbers = isinstance(value, dict) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in value.values()
            )
            if not numbers:
                raise ValueError("stage channel: 'stats' is not a mapping of numbers")
        elif not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"stage channel: '{key}' is not a list of strings")
    return message


class StageLink:
    """One scheduler connection on the worker side; answers may come from any thread."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def answer(self, staged: Iterable[str], failed: Iterable[str], weights: str) -> None:
        self.send({"staged": list(staged), "failed": list(failed), "weights": [weights]})

    def send(self, message: Message) -> None:
        frame = _encode(message)
        try:
            with self._lock:
                self._conn.send_bytes(frame)
        except OSError as exc:  # the scheduler went away: nothing waits for the answer
            logger.debug("Stage message not delivered: %s", exc)


class StageListener:
    """Worker side: accept the scheduler's connection and pass its orders on."""

    def __init__(
        self,
        path: str,
        on_order: Callable[[list[str], str, StageLink], None],
        hello: Callable[[], Message | None] = lambda: None,
    ) -> None:
        self.path = path
        self._on_order = on_order
        self._hello = hello
        self._links: list[StageLink] = []
        self._links_lock = threading.Lock()
        _remove_stale(path)
        self._listener = Listener(path, family="AF_UNIX")
        os.chmod(path, 0o600)
        self._closed = False
        self._conns: list[Connection] = []
        self._threads: list[threading.Thread] = []
        self._thread = threading.Thread(
            target=self._accept_loop, name="ec-stage-channel", daemon=True
        )
        self._thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:
                return  # closed
            if self._closed:
                conn.close()
                return
            self._conns.append(conn)
            thread = threading.Thread(
                target=self._serve, args=(conn,), name="ec-stage-orders", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    @property
    def connected(self) -> bool:
        """True while a scheduler is connected."""
        with self._links_lock:
            return bool(self._links)

    def broadcast(self, message: Message) -> None:
        """Send ``message`` to every connected scheduler, before returning.

        Under the same lock as a new link's hello: whichever comes last on a
        link is the newest state.
        """
        with self._links_lock:
            for link in self._links:
                link.send(message)

    def _serve(self, conn: Connection) -> None:
        link = StageLink(conn)
        with self._links_lock:
            self._links.append(link)
            hello = self._hello()
            if hello is not None:
                link.send(hello)
        with contextlib.closing(conn):
            self._read_orders(conn, link)
        with self._links_lock:
            self._links.remove(link)

    def _read_orders(self, conn: Connection, link: StageLink) -> None:
        while True:
            try:
                message = _decode(conn.recv_bytes())
            except (EOFError, OSError):
                return
            except ValueError as exc:
                logger.warning("Dropping a malformed stage order: %s", exc)
                continue
            if message.get("stage"):
                weights = message.get("weights") or [""]
                self._on_order(message["stage"], weights[0], link)

    def close(self, timeout: float = 2.0) -> None:
        """Stop accepting and serving; a blocked accept or read is woken, not waited out."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            Client(self.path, family="AF_UNIX").close()  # wakes the accept
        for conn in self._conns:
            _shut(conn)  # wakes a blocked read
        self._thread.join(timeout)
        for thread in self._threads:
            thread.join(timeout)
        with contextlib.suppress(OSError):
            self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _shut(conn: Connection) -> None:
    """Shut a connection's socket down so a thread blocked reading it returns."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


def _remove_stale(path: str) -> None:
    """Unlink a socket file nobody listens on; refuse to take a live one over."""
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise OSError(f"{path}: another process listens there")


class StageClient:
    """Scheduler side: one connection per rank; orders out, answers in."""

    RETRY_S = 10.0  # between connection attempts, after one failed

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self._conns: list[Connection] | None = None
        self._retry_at = 0.0

    def connect(self) -> bool:
        """Connect to every rank; False (and no connection kept) if any is missing."""
        if self._conns is not None:
            return True
        conns: list[Connection] = []
        try:
            for path in self.paths:
                conns.append(Client(path, family="AF_UNIX"))
        except OSError as exc:
            logger.debug("Stage channel unavailable (%s)", exc)
            for conn in conns:
                conn.close()
            return False
        self._conns = conns
        return True

    @property
    def connected(self) -> bool:
        return self._conns is not None

    def reconnect(self) -> bool:
        """``connect``, tried at most every ``RETRY_S`` seconds after a failure."""
        now = time.monotonic()
        if self._conns is None and now < self._retry_at:
            return False
        if self.connect():
            return True
        self._retry_at = now + self.RETRY_S
        return False

    def send(self, identifiers: list[str], weights: str = "") -> bool:
        """Order every rank to stage ``identifiers`` (keyed under ``weights``).

        False if the channel is not connected or broke.
        """
        if self._conns is None:
            return False
        frame = _encode({"stage": identifiers, "weights": [weights]})
        try:
            for conn in self._conns:
                conn.send_bytes(frame)
        except OSError as exc:
            logger.warning("Stage channel broke (%s); orders go with step metadata", exc)
            self.close()
            return False
        return True

    def receive(self, timeout: float = 0.0) -> list[Message]:
        """Messages that arrived from any rank, in order per rank.

        Waits up to ``timeout`` seconds for the first one; never blocks after it.
        """
        if self._conns is None:
            return []
        answers = []
        ready = wait(self._conns, timeout) if timeout > 0 else self._ready_now()
        while ready:
            for conn in ready:
                try:
                    message = _decode(conn.recv_bytes())
                except (EOFError, OSError) as exc:
                    logger.warning("Stage channel broke (%s)", exc)
                    self.close()
                    return answers
                except ValueError as exc:
                    logger.warning("Dropping a malformed stage answer: %s", exc)
                    continue
                answers.append(message)
            ready = self._ready_now()
        return answers

    def _ready_now(self) -> list[Connection]:
        assert self._conns is not None
        return [conn for conn in self._conns if conn.poll(0)]

    def close(self) -> None:
        for conn in self._conns or ():
            with contextlib.suppress(OSError):
                conn.close()
        self._conns = None
