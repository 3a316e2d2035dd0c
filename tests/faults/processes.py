"""Real processes for the fault suite: a killable S3 server and Python workers.

``S3Process`` is moto's server as a separate process (``python -m
moto.server``) so that it can be killed with SIGKILL and started again on the
same port, as a crashed S3 endpoint would be; its state is in memory, so a
restarted server is empty. ``worker`` starts ``python -c <script>`` from the
repository root with LMCache's logging quiet.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.servers import HOST, _wait_for_port, free_port

ROOT = Path(__file__).resolve().parents[2]


class S3Process:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self.port, timeout=30)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")


def worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_EC_")}
    env["LMCACHE_LOG_LEVEL"] = "ERROR"
    return env


def worker(script: str, *args: str, **popen: object) -> subprocess.Popen:
    """``python -c script args…`` from the repository root; stdout/stderr piped, text."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
