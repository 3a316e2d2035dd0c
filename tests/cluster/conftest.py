"""A real three-primary Redis Cluster on 127.0.0.1 (no replicas), for the session,
and one with a replica per primary for a test that needs a failover.

Each node runs ``redis-server --cluster-enabled yes`` in its own directory
(its ``nodes.conf`` survives a kill, so a restarted node rejoins with its
slots); ``redis-cli --cluster create`` assigns the slots. Nodes serve their
own slots while another is down (``cluster-require-full-coverage no``).
A test may move slots between primaries (``move_slot``, ``begin_moving``); each
test starts with the slots where the cluster was created.
A missing binary fails the test (never skips).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from redis.crc import key_slot

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
        args += ["--repl-diskless-sync-delay", "0"]  # a replica syncs at once, not in 5 s
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
    owners: dict[int, int] = field(default_factory=dict)  # slot -> port, as created
    moved: set[int] = field(default_factory=set)  # slots a test moved

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"{HOST}:{node.port}" for node in self.nodes)

    @property
    def primaries(self) -> list[ClusterNode]:
        """The live primaries, ordered by the first slot each holds (as
        ``CLUSTER SLOTS`` lists them, and so a client's map)."""
        ports = dict.fromkeys(port for _, _, port in self._slot_ranges())
        return [self._node(port) for port in ports]

    def slot_of(self, key: str) -> int:
        return key_slot(key.encode())

    def node_of(self, key: str) -> ClusterNode:
        """The node owning ``key``'s slot, asked of the servers themselves."""
        return self.owner(self.slot_of(key))

    def owner(self, slot: int) -> ClusterNode:
        for start, end, port in self._slot_ranges():
            if start <= slot <= end:
                return self._node(port)
        raise AssertionError(f"slot {slot} unassigned")

    def _slot_ranges(self) -> list[tuple[int, int, int]]:
        live = next(node for node in self.nodes if node.alive)
        return [(start, end, owner[1]) for start, end, owner, *_ in live.client().cluster("slots")]

    def _node(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)

    def node_id(self, node: ClusterNode) -> str:
        return node.client().execute_command("CLUSTER MYID").decode()

    def begin_moving(self, slot: int, to: ClusterNode) -> ClusterNode:
        """Marks ``slot`` as moving to ``to`` (IMPORTING there, MIGRATING at its
        owner), as ``redis-cli --cluster reshard`` does before it moves the keys:
        the owner answers ``ASK`` for a key it does not hold. Returns the owner."""
        source = self.owner(slot)
        self.moved.add(slot)
        to.client().execute_command("CLUSTER SETSLOT", slot, "IMPORTING", self.node_id(source))
        source.client().execute_command("CLUSTER SETSLOT", slot, "MIGRATING", self.node_id(to))
        return source

    def migrate(self, source: ClusterNode, to: ClusterNode, keys: list[str]) -> None:
        """Moves ``keys`` of a moving slot from ``source`` to ``to``."""
        source.client().execute_command("MIGRATE", HOST, to.port, "", 0, 5000, "KEYS", *keys)

    def move_slot(self, slot: int, to: ClusterNode) -> None:
        """Moves ``slot`` and its keys to ``to``, as a resharding does; every node
        is told at once, so the old owner answers ``MOVED`` for it from now on."""
        source = self.begin_moving(slot, to)
        keys = source.client().cluster("getkeysinslot", slot, 1000)
        if keys:
            self.migrate(
                source, to, [key if isinstance(key, str) else key.decode() for key in keys]
            )
        self._assign(slot, to)

    def _assign(self, slot: int, to: ClusterNode) -> None:
        # The new owner first, with a config epoch above every other: gossip of an
        # earlier owner's claim (it may have bumped its epoch taking the slot) still
        # in flight would otherwise win over this assignment on some nodes for good
        # (seen on a loaded machine as "the nodes disagree on the slots").
        owner = self.node_id(to)
        to.client().execute_command("CLUSTER SETSLOT", slot, "NODE", owner)
        to.client().execute_command("CLUSTER BUMPEPOCH")
        for node in self.nodes:
            if node.alive and node is not to:
                node.client().execute_command("CLUSTER SETSLOT", slot, "NODE", owner)

    def wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [node.client().cluster("info").get("cluster_state") for node in self.nodes]
            if all(state == "ok" for state in states):
                return
            time.sleep(0.1)
        raise RuntimeError(f"cluster not ok after {timeout}s: {states}")

    def reset(self) -> None:
        """Every node up and empty, every slot where the cluster was created."""
        for node in self.nodes:
            if not node.alive:
                node.start()
        self.wait_ok()
        for node in self.nodes:
            node.client().flushall()
        moved = sorted(self.moved)
        self.moved.clear()
        self._put_back(moved)
        self._wait_slots(moved)

    def _put_back(self, slots: list[int]) -> None:
        for slot in slots:
            for node in self.nodes:
                node.client().execute_command("CLUSTER SETSLOT", slot, "STABLE")
            self._assign(slot, self._node(self.owners[slot]))

    def _wait_slots(self, slots: list[int], timeout: float = 30.0) -> None:
        """Until every node's map puts every slot where the cluster was created, and
        no slot is being moved; the moved ones are put back again each second."""
        deadline = time.monotonic() + timeout
        again = time.monotonic() + 1.0
        while not all(self._agrees(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes disagree on the slots")
            if time.monotonic() > again:
                self._put_back(slots)
                again = time.monotonic() + 1.0
            time.sleep(0.05)

    def _agrees(self, node: ClusterNode) -> bool:
        client = node.client()
        mine = next(v for v in client.cluster("nodes").values() if "myself" in v["flags"])
        if mine["migrations"]:  # a slot left MIGRATING/IMPORTING here
            return False
        for start, end, owner, *_ in client.cluster("slots"):
            if any(self.owners.get(slot) != owner[1] for slot in range(start, end + 1)):
                return False
        return True


@contextlib.contextmanager
def _running_cluster(primaries: int, replicas: int) -> Iterator[RedisCluster]:
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.fail("redis-cli not found on PATH (Debian package redis-tools)")
    count = primaries * (1 + replicas)
    nodes = [
        ClusterNode(_cluster_port(), tempfile.mkdtemp(prefix="ec-cluster-")) for _ in range(count)
    ]
    cluster = RedisCluster(nodes)
    try:
        for node in nodes:
            node.start()
        addresses = [f"{HOST}:{node.port}" for node in nodes]
        options = ["--cluster-replicas", str(replicas), "--cluster-yes"]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, *options],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=60,
        )
        cluster.wait_ok()
        for start, end, port in cluster._slot_ranges():
            cluster.owners.update(dict.fromkeys(range(start, end + 1), port))
        yield cluster
    finally:
        for node in nodes:
            node.kill()
            shutil.rmtree(node.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_cluster_session() -> Iterator[RedisCluster]:
    with _running_cluster(3, 0) as cluster:
        yield cluster


@pytest.fixture
def redis_cluster(redis_cluster_session: RedisCluster) -> RedisCluster:
    """The session's cluster with every node up, no keys, and its slots as created."""
    redis_cluster_session.reset()
    return redis_cluster_session


@pytest.fixture
def redis_cluster_with_replicas() -> Iterator[RedisCluster]:
    """A cluster of its own (a failover changes it): three primaries, each with a
    replica."""
    with _running_cluster(3, 1) as cluster:
        replicas = [node for node in cluster.nodes if node not in cluster.primaries]
        deadline = time.monotonic() + 30
        while not all(_replicating(node) for node in replicas):
            assert time.monotonic() < deadline, "the replicas never joined"
            time.sleep(0.05)
        yield cluster


def _replicating(node: ClusterNode) -> bool:
    info = node.client().info("replication")
    return info.get("role") == "slave" and info.get("master_link_status") == "up"
