"""The ``Drip`` server of ``tests/servers.py``, run as a process of its own.

In the test's process its threads waited on the test's GIL: a collection or a
busy thread there could hold its first byte past a 0.5 s ``remote_timeout``,
and the read timed out before any drip began. Standard library only.

Argument: a JSON object ``{"protocol", "interval", "drip_on", "replies"}``
(bytes as latin-1 strings; ``{port}`` in a reply is the server's port).
Prints ``port N``, then ``dripping`` and ``cut`` as they happen. Exits when
its standard input closes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

HOST = "127.0.0.1"
RESP_REPLIES = {
    b"HELLO": b"%1\r\n$5\r\nproto\r\n:3\r\n",  # RESP3, which redis-py asks for
    b"PING": b"+PONG\r\n",
    b"EXISTS": b":1\r\n",
}
_print_lock = threading.Lock()


def _tell(event: str) -> None:
    with _print_lock:
        sys.stdout.write(event + "\n")
        sys.stdout.flush()


def resp_commands(buffer: bytes) -> tuple[list[list[bytes]], bytes]:
    """The whole RESP commands at the start of ``buffer``, and what is left."""
    commands = []
    while buffer.startswith(b"*") and b"\r\n" in buffer:
        head, rest = buffer.split(b"\r\n", 1)
        words = []
        for _ in range(int(head[1:])):
            if b"\r\n" not in rest:
                return commands, buffer
            size, rest = rest.split(b"\r\n", 1)
            length = int(size[1:])
            if len(rest) < length + 2:
                return commands, buffer
            words.append(rest[:length])
            rest = rest[length + 2 :]
        commands.append(words)
        buffer = rest
    return commands, buffer


class DripServer:
    def __init__(self, protocol: str, interval: float, drip_on: bytes, replies: dict) -> None:
        self.protocol, self.interval, self.drip_on = protocol, interval, drip_on
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((HOST, 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        port = str(self.port).encode()
        filled = {name: reply.replace(b"{port}", port) for name, reply in replies.items()}
        self.replies = {**RESP_REPLIES, **filled}

    def serve_forever(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buffer = b""
            while data := conn.recv(65536):
                buffer += data
                if self.protocol == "http":
                    if b"\r\n\r\n" in buffer:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                        return self._drip(conn)
                    continue
                commands, buffer = resp_commands(buffer)
                for command in commands:
                    name = command[0].upper()
                    if name == self.drip_on:
                        conn.sendall(b":" if name == b"DEL" else b"$%d\r\n" % (1 << 20))
                        return self._drip(conn)
                    conn.sendall(self.replies.get(name, b"+OK\r\n"))

    def _drip(self, conn: socket.socket) -> None:
        _tell("dripping")
        while True:
            try:
                conn.sendall(b"1")
            except OSError:
                _tell("cut")
                return
            time.sleep(self.interval)


def main() -> None:
    spec = json.loads(sys.argv[1])
    server = DripServer(
        spec["protocol"],
        spec["interval"],
        spec["drip_on"].encode("latin-1"),
        {k.encode("latin-1"): v.encode("latin-1") for k, v in spec["replies"].items()},
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _tell(f"port {server.port}")
    sys.stdin.read()  # the test closed it, or died
    os._exit(0)


if __name__ == "__main__":
    main()
