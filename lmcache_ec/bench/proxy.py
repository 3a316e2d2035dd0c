"""A TCP proxy on 127.0.0.1 that delays every client-to-server chunk.

Put in front of a real redis-server it makes each command arrive ``delay``
seconds late, like a distant data centre; replies pass through at once.
Used by ``bench steps`` and the test suite.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

HOST = "127.0.0.1"


def _end_of_stream(sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class SlowProxy:
    def __init__(self, target_port: int, delay: float) -> None:
        """Forward 127.0.0.1:``self.port`` to 127.0.0.1:``target_port``."""
        self.target_port = target_port
        self.delay = delay
        self.chunks = 0  # client-to-server chunks forwarded (about one per command)
        self._lock = threading.Lock()
        self._listener = socket.create_server((HOST, 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept_loop, name="slow-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}"

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((HOST, self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, delayed: bool) -> None:
        if not delayed:
            self._forward(source, sink)
            return
        # A latency line, not a throttle: each chunk leaves ``delay`` after it
        # arrived, so a large value costs one delay, not one per chunk.
        line: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
        threading.Thread(target=self._deliver, args=(line, sink), daemon=True).start()
        with contextlib.suppress(OSError):
            while data := source.recv(1 << 20):
                line.put((time.monotonic() + self.delay, data))
        line.put(None)

    def _deliver(self, line: queue.SimpleQueue, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while (entry := line.get()) is not None:
                due, data = entry
                time.sleep(max(0.0, due - time.monotonic()))
                with self._lock:
                    self.chunks += 1
                sink.sendall(data)
        _end_of_stream(sink)

    def _forward(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(1 << 20):
                sink.sendall(data)
        _end_of_stream(sink)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
