"""Throwaway Redis and S3-compatible servers on 127.0.0.1 for `bench remote --local-servers`."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"server on 127.0.0.1:{port} did not start")


@contextlib.contextmanager
def local_redis() -> Iterator[str]:
    """A redis-server without persistence; yields its redis:// URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found (Debian/Ubuntu: apt-get install redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        process = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_port(port)
            yield f"redis://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=10)


@contextlib.contextmanager
def local_s3(bucket: str = "lmcache-ec-bench") -> Iterator[str]:
    """A moto S3 server with ``bucket``; yields its endpoint URL."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        ).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()
