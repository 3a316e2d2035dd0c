"""Building the Redis Cluster client: startup nodes that never answer.

Building it asks the startup nodes for the slot map, one after another, each
for up to ``remote_timeout``. One caller builds it, outside the store's lock:
concurrent calls never each build their own, a failed build is not tried again
for ``remote_retry_interval`` (calls meanwhile fail at once, connecting to
nothing), and ``close`` never waits for a build in progress.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis.cluster
from redis.exceptions import RedisClusterException

from lmcache_ec.config import load_config
from lmcache_ec.remote.redis_cluster import RedisClusterStore
from lmcache_ec.remote.store import StoreError, open_store
from tests.remote.conftest import remote_config
from tests.servers import HOST, BlackHole

CALLERS = 4
LIVENESS = 30.0  # only ever reached if a call hangs: never a timing bound


class HungNodes:
    """Startup nodes that accept connections and never answer."""

    def __init__(self, count: int) -> None:
        self.holes = [BlackHole() for _ in range(count)]
        self._fences = 0

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"{HOST}:{hole.port}" for hole in self.holes)

    def connections(self) -> int:
        """Connections made to the nodes so far. A fence connection to each node,
        once accepted, shows every earlier one was (a listener accepts in order)."""
        self._fences += 1
        total = 0
        for hole in self.holes:
            with socket.create_connection((HOST, hole.port)) as fence:
                address = fence.getsockname()
                deadline = time.monotonic() + LIVENESS
                while not any(_peer(conn) == address for conn in list(hole.accepted)):
                    assert time.monotonic() < deadline, "the fence was never accepted"
                    time.sleep(0.01)
            total += len(hole.accepted)
        return total - self._fences * len(self.holes)

    def close(self) -> None:
        for hole in self.holes:
            hole.close()


def _peer(conn: socket.socket) -> object:
    try:
        return conn.getpeername()
    except OSError:
        return None


@pytest.fixture
def hung_nodes() -> Iterator[HungNodes]:
    nodes = HungNodes(3)
    try:
        yield nodes
    finally:
        nodes.close()


def _store(url: str, *, timeout: float, retry: float) -> RedisClusterStore:
    config = remote_config(url, remote_timeout=timeout, remote_retry_interval=retry)
    store = open_store(load_config(config).remote)
    assert isinstance(store, RedisClusterStore)
    return store


def _all_at_once(call: Callable[[], object], count: int = 1) -> list[Exception | None]:
    """``call()`` in ``count`` threads started together: what each raised."""
    barrier = threading.Barrier(count)
    raised: list[Exception | None] = [None] * count

    def one(index: int) -> None:
        barrier.wait()
        try:
            call()
        except Exception as exc:
            raised[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LIVENESS)
        assert not thread.is_alive(), "a call hung"
    return raised


def test_concurrent_calls_build_the_client_once_and_a_failed_build_waits_its_interval(
    hung_nodes,
):
    store = _store(hung_nodes.url, timeout=0.2, retry=3600.0)
    try:
        raised = _all_at_once(lambda: store.exists("ec1.x.y.0"), CALLERS)
        assert all(exc is not None for exc in raised)
        # One build, one connection per startup node: never one build per caller.
        assert hung_nodes.connections() == len(hung_nodes.holes)

        # Within the retry interval: a clear error at once, no node asked again.
        with pytest.raises(StoreError, match="unreachable"):
            store.get("ec1.x.y.0")
        with pytest.raises(StoreError):
            store.get_many(["ec1.x.y.1"])
        with pytest.raises(StoreError):
            store.ping()
        assert hung_nodes.connections() == len(hung_nodes.holes)
    finally:
        store.close()


def test_a_failed_build_is_tried_again_after_the_retry_interval(hung_nodes):
    store = _store(hung_nodes.url, timeout=0.2, retry=0.05)
    try:
        with pytest.raises(RedisClusterException):
            store.exists("ec1.x.y.0")
        first = hung_nodes.connections()
        assert first == len(hung_nodes.holes)
        time.sleep(0.1)  # past the retry interval: the nodes are asked again
        with pytest.raises(RedisClusterException):
            store.exists("ec1.x.y.0")
        assert hung_nodes.connections() == 2 * first
    finally:
        store.close()


class _BlockedCluster:
    """Cluster clients whose construction blocks until ``release`` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.built: list[_Client] = []

    def __call__(self, **_: object) -> _Client:
        client = _Client()
        self.built.append(client)
        self.entered.set()
        assert self.release.wait(LIVENESS)
        return client


class _Client:
    closed = False

    def close(self) -> None:
        self.closed = True


def test_close_and_other_calls_never_wait_for_a_build_in_progress(monkeypatch):
    blocked = _BlockedCluster()
    monkeypatch.setattr(redis.cluster, "NodesManager", blocked)
    store = _store("redis-cluster://127.0.0.1:1", timeout=0.2, retry=3600.0)
    outcome: list[Exception | None] = []

    def building() -> None:
        try:
            store.exists("ec1.x.y.0")
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)

    builder = threading.Thread(target=building)
    builder.start()
    try:
        assert blocked.entered.wait(LIVENESS)
        # Another call gives up on the build rather than wait it out or build
        # its own; close() returns while the build is still blocked.
        (raised,) = _all_at_once(lambda: store.exists("ec1.x.y.1"))
        assert isinstance(raised, StoreError)
        assert _all_at_once(store.close) == [None]
        assert builder.is_alive() and len(blocked.built) == 1
    finally:
        blocked.release.set()
        builder.join(LIVENESS)
    assert not builder.is_alive()
    # Built for a store closed meanwhile: closed by its builder, never published.
    (late,) = blocked.built
    assert late.closed
    assert isinstance(outcome[0], StoreError)
    assert store._slots.current is None
