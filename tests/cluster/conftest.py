"""A real three-primary Redis Cluster on 127.0.0.1 (no replicas), for the session.

Each node runs ``redis-server --cluster-enabled yes`` in its own directory
(its ``nodes.conf`` survives a kill, so a restarted node rejoins with its
slots); ``redis-cli --cluster create`` assigns the slots. Nodes serve their
own slots while another is down (``cluster-require-full-coverage no``).
A missing binary fails the test (never skips).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.servers import HOST, _wait_for_port, free_port


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free and valid too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 <= 65535 and _is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


@dataclass
class ClusterNode:
    port: int
    workdir: str
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server not found on PATH (Debian package redis-server)")
        args = [binary, "--bind", HOST, "--port", str(self.port), "--dir", self.workdir]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no"]
        args += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.workdir
        )
        _wait_for_port(self.port)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self):
        import redis

        return redis.Redis(host=HOST, port=self.port, socket_timeout=5)


@dataclass
class RedisCluster:
    nodes: list[ClusterNode]

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"{HOST}:{node.port}" for node in self.nodes)

    def node_of(self, key: str) -> ClusterNode:
        """The node owning ``key``'s slot, asked of the servers themselves."""
        live = next(node for node in self.nodes if node.alive)
        slot = live.client().cluster("keyslot", key)
        for start, end, owner, *_ in live.client().cluster("slots"):
            if start <= slot <= end:
                port = owner[1]
                return next(node for node in self.nodes if node.port == port)
        raise AssertionError(f"slot {slot} unassigned")

    def wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [node.client().cluster("info").get("cluster_state") for node in self.nodes]
            if all(state == "ok" for state in states):
                return
            time.sleep(0.1)
        raise RuntimeError(f"cluster not ok after {timeout}s: {states}")

    def reset(self) -> None:
        """Every node up and empty."""
        for node in self.nodes:
            if not node.alive:
                node.start()
        self.wait_ok()
        for node in self.nodes:
            node.client().flushall()


@pytest.fixture(scope="session")
def redis_cluster_session() -> Iterator[RedisCluster]:
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.fail("redis-cli not found on PATH (Debian package redis-tools)")
    nodes = [ClusterNode(_cluster_port(), tempfile.mkdtemp(prefix="ec-cluster-")) for _ in range(3)]
    cluster = RedisCluster(nodes)
    try:
        for node in nodes:
            node.start()
        addresses = [f"{HOST}:{node.port}" for node in nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=60,
        )
        cluster.wait_ok()
        yield cluster
    finally:
        for node in nodes:
            node.kill()
            shutil.rmtree(node.workdir, ignore_errors=True)


@pytest.fixture
def redis_cluster(redis_cluster_session: RedisCluster) -> RedisCluster:
    """The session's cluster with every node up and no keys."""
    redis_cluster_session.reset()
    return redis_cluster_session
