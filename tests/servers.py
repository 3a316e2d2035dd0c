"""Real servers on 127.0.0.1 for the remote-tier tests.

- ``redis_server`` (session): a ``redis-server`` on a free port, temp dir, no
  persistence; flushed before each test that uses the function-scoped
  ``redis_url``. A missing binary fails the test (never skips).
- ``redis_process`` (function): a private redis-server the test may kill and
  restart on the same port (``kill()``, ``restart()``).
- ``s3_server`` (session): moto's S3 app on a threaded server, its conditional
  writes made atomic as S3's are (``ConditionalWritesAtomic``); ``s3_bucket``
  (function) creates a fresh bucket on it.
- ``black_hole`` (function): a TCP server that accepts and never answers.
- ``Drip``: a server that answers, but sends a value (Redis) or a response
  (HTTP) a byte at a time, each byte within any socket timeout.
- ``Gateway``: an HTTP proxy in front of a server (moto) that may answer a
  request itself or send it to another path, as a misbehaving proxy would.
- ``redis_commands(url, action)``: runs ``action`` and returns what it
  returned with every command the server ran meanwhile (``MONITOR``), so a
  test counts its own reads, not the background threads' ones.

Tests reach these only through ``redis_url`` / ``s3_endpoint`` strings, as a
user would.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

HOST = "127.0.0.1"
REDIS_PASSWORD = "ec-test-secret"
T = TypeVar("T")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listening on {HOST}:{port} after {timeout}s")


@dataclass
class RedisProcess:
    """One redis-server; ``kill()`` and ``restart()`` keep the port."""

    port: int
    workdir: str
    password: str | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server not found on PATH (Debian package redis-server)")
        args = [
            binary,
            "--bind",
            HOST,
            "--port",
            str(self.port),
            "--dir",
            self.workdir,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.workdir
        )
        _wait_for_port(self.port)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def client(self):
        import redis

        return redis.Redis(host=HOST, port=self.port, password=self.password, socket_timeout=5)


def _redis(password: str | None = None) -> Iterator[RedisProcess]:
    workdir = tempfile.mkdtemp(prefix="ec-redis-")
    server = RedisProcess(port=free_port(), workdir=workdir, password=password)
    try:
        server.start()
        yield server
    finally:
        server.kill()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProcess]:
    yield from _redis()


@pytest.fixture(scope="session")
def redis_server_auth() -> Iterator[RedisProcess]:
    """A redis-server that requires ``REDIS_PASSWORD``."""
    yield from _redis(REDIS_PASSWORD)


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> str:
    """URL of the shared redis-server, emptied for this test."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    redis_server.client().flushall()
    return redis_server.url


@pytest.fixture
def redis_process() -> Iterator[RedisProcess]:
    """A private redis-server this test may kill and restart."""
    yield from _redis()


@dataclass
class S3Server:
    endpoint: str
    _buckets: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def new_bucket(self) -> str:
        name = f"ec-test-{os.getpid()}-{next(self._buckets)}"
        self.client().create_bucket(Bucket=name)
        return name


class ConditionalWritesAtomic:
    """moto checks ``If-Match`` / ``If-None-Match``, then writes, with nothing
    held between: two conditional puts on one ETag can both pass (under load, an
    append was lost). S3 checks and writes as one step; this makes moto do so
    for the conditional requests the product sends."""

    def __init__(self, app: Callable) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable):
        if "HTTP_IF_MATCH" not in environ and "HTTP_IF_NONE_MATCH" not in environ:
            return self.app(environ, start_response)
        with self.lock:
            return list(self.app(environ, start_response))


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = ConditionalWritesAtomic(DomainDispatcherApplication(create_backend_app))
    server = make_server(HOST, free_port(), app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto", daemon=True)
    thread.start()
    try:
        yield S3Server(endpoint=f"http://{HOST}:{server.server_port}")
    finally:
        server.shutdown()
        thread.join(timeout=10)


@pytest.fixture
def aws_env(monkeypatch):
    """Credentials through the standard AWS environment chain, as users give them."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)


@pytest.fixture
def s3_bucket(s3_server: S3Server, aws_env) -> str:
    return s3_server.new_bucket()


class BlackHole:
    """Accepts TCP connections and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((HOST, 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="black-hole", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted.append(conn)  # held open, never read or answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    server = BlackHole()
    try:
        yield server
    finally:
        server.close()


DRIP_SERVER_SCRIPT = Path(__file__).with_name("drip_server.py")


class Drip:
    """Accepts TCP connections and answers slowly enough that no answer ends.

    ``protocol="redis"``: ``EXISTS`` is answered ``1`` and ``PING`` ``PONG`` at
    once; the command ``drip_on`` (default ``GETRANGE``, a read of a value) is
    answered with a 1 MiB bulk string (``DEL``: an integer of no end) sent a
    byte every ``interval`` seconds; ``replies`` answers others at once
    (``{port}`` in a reply is the server's port).
    ``protocol="http"``: any request gets a status line, then header bytes a
    byte at a time. ``dripping`` is set once an answer has begun to drip,
    ``cut`` when a client hangs up on one. The server is a process of its own
    (``tests/drip_server.py``), so the test's threads never delay its answers.
    """

    def __init__(
        self,
        protocol: str,
        interval: float,
        drip_on: bytes = b"GETRANGE",
        replies: dict[bytes, bytes] | None = None,
    ) -> None:
        spec = {
            "protocol": protocol,
            "interval": interval,
            "drip_on": drip_on.decode("latin-1"),
            "replies": {
                k.decode("latin-1"): v.decode("latin-1") for k, v in (replies or {}).items()
            },
        }
        self.dripping, self.cut = threading.Event(), threading.Event()
        self._process = subprocess.Popen(
            [sys.executable, "-I", str(DRIP_SERVER_SCRIPT), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        first = self._process.stdout.readline()
        if not first.startswith("port "):
            self.close()
            raise RuntimeError(f"the drip server did not start: {first!r}")
        self.port = int(first.split()[1])
        threading.Thread(target=self._follow, name="drip-events", daemon=True).start()

    def _follow(self) -> None:
        events = {"dripping": self.dripping, "cut": self.cut}
        for line in self._process.stdout:
            if event := events.get(line.strip()):
                event.set()
        self._process.stdout.close()

    def close(self) -> None:
        self._process.kill()
        self._process.wait(timeout=10)
        self._process.stdin.close()


Answer = tuple[int, dict[str, str], bytes]  # status, headers, body


class Gateway:
    """An HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream``.

    ``route(method, path, headers)`` decides each request: None forwards it as is, a
    path (``/bucket/key``) forwards it there instead, an ``Answer`` is sent
    without asking upstream. ``endpoint`` is its URL."""

    def __init__(
        self, upstream: str, route: Callable[[str, str, dict[str, str]], str | Answer | None]
    ) -> None:
        import http.client
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        target = urlsplit(upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _any(self) -> None:
                sent = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                decided = route(self.command, self.path, dict(self.headers))
                if isinstance(decided, tuple):
                    return self._answer(*decided)
                upstream_connection = http.client.HTTPConnection(target.hostname, target.port)
                try:
                    upstream_connection.request(
                        self.command, decided or self.path, sent, dict(self.headers)
                    )
                    reply = upstream_connection.getresponse()
                    body = reply.read()
                finally:
                    upstream_connection.close()
                self._answer(reply.status, dict(reply.getheaders()), body)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://{HOST}:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, name="gateway", daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def redis_commands(url: str, action: Callable[[], T]) -> tuple[T, list[list[str]]]:
    """``action()``'s result and the commands (split in words) the server ran
    while it ran, from every client; an ``ECHO`` marks the end."""
    import redis

    marker = f"end-{uuid.uuid4().hex}"
    with contextlib.closing(redis.Redis.from_url(url)) as client, client.monitor() as monitor:
        result = action()  # MONITOR was confirmed before this runs
        client.echo(marker)
        commands = []
        while (command := monitor.next_command()["command"]) != f"ECHO {marker}":
            commands.append(command.split(" "))
    return result, commands
