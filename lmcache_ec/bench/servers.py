"""Throwaway Redis and S3-compatible servers on 127.0.0.1, and reachability probes.

``bench`` starts ``redis-server`` and moto's S3 server when no store is given
and the binaries are there; ``probe_*`` say why a store cannot be measured
(the tier is then reported as skipped, with that reason).
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from ..remote_names import parse_s3_url, redact


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


def _create_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    ).create_bucket(Bucket=bucket)


@contextlib.contextmanager
def moto_process(bucket: str = "lmcache-ec-bench") -> Iterator[str]:
    """moto's S3 server in its own process (not a thread of the process being
    measured, which would share its GIL); yields its endpoint URL.

    moto is not a runtime dependency: ``MissingDependency`` names the extra."""
    reason = moto_missing()
    if reason is not None:
        raise MissingDependency(reason)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, timeout=60.0)
        endpoint = f"http://127.0.0.1:{port}"
        _create_bucket(endpoint, bucket)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class MissingDependency(RuntimeError):
    """A benchmark needs a package of an extra that is not installed."""


BENCH_EXTRA = "pip install 'lmcache-ec[bench]'"


def moto_missing() -> str | None:
    """Why a local S3 server cannot start (None when it can)."""
    for module in ("moto.server", "flask"):
        try:
            if importlib.util.find_spec(module) is None:
                raise ImportError(module)
        except ImportError:
            return (
                f"{module} is not installed: a local S3 server needs moto, not a "
                f"runtime dependency ({BENCH_EXTRA}); or give an S3 endpoint"
            )
    return None


def probe_redis(url: str, timeout: float = 3.0) -> str | None:
    """None when ``url`` answers PING, else why not."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        client.ping()
        client.close()
    except Exception as exc:
        return f"{redact(url)} unreachable: {type(exc).__name__}: {exc}"
    return None


def probe_s3(url: str, endpoint_url: str | None, region: str | None) -> str | None:
    """None when the bucket of ``url`` (s3://bucket/prefix) answers, else why not."""
    import boto3
    from botocore.config import Config

    try:
        bucket = parse_s3_url(url).bucket
        client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            config=Config(connect_timeout=3, read_timeout=5, retries={"max_attempts": 1}),
        )
        client.head_bucket(Bucket=bucket)
    except Exception as exc:
        return f"{redact(url)} at {endpoint_url or 'AWS'} unreachable: {type(exc).__name__}: {exc}"
    return None
