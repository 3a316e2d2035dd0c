"""The Redis Cluster store (``redis-cluster://``).

redis-py's ``RedisCluster`` keeps the slot map; each call goes to the owning
primary's own client, so a shard that is down costs only its own keys: their
calls raise ``ShardUnavailable`` (batched reads answer None for them) and the
shard is skipped at once for ``remote_retry_interval`` before it is tried
again. Batched reads send one pipeline per primary. The cluster client is
built on first use by one caller, outside any lock (it asks the startup nodes
in turn); other callers wait for it at most ``remote_timeout``, and a failed
build is not tried again for ``remote_retry_interval``: calls meanwhile raise
``StoreError`` at once. Keys, bounded reads and timeouts: ``redis_store.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from ..config import RemoteSettings
from ..remote_names import (
    NodeList,
    claim_key,
    parse_node_list,
    redact,
    redis_data_key,
    redis_meta_key,
)
from .bounded import bounded_frame
from .redis_store import (
    _NODE_ERRORS,
    APPEND_LOG,
    CLAIM,
    RELEASE,
    _failed,
    _metadata,
    _present_value,
    _queue_read,
    _scan,
    _sized,
    client_options,
)
from .store import RemoteStore, ShardUnavailable, StoreError

logger = logging.getLogger(__name__)


class _Build:
    """One build of a cluster client; callers that need the client meanwhile
    wait on ``done`` instead of building their own."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.cluster: Any = None  # the client published, once done; None if it failed
        self.outcome = "the build failed"  # why there is no client


class RedisClusterStore(RemoteStore):
    """A Redis Cluster: each call on the primary owning the key's slot."""

    def __init__(self, nodes: NodeList, settings: RemoteSettings) -> None:
        self.timeout = settings.timeout
        self.max_frame = settings.max_frame_bytes
        self._where = redact(settings.url)
        self._nodes = nodes
        self._retry_interval = settings.retry_interval
        # Guards the cluster client, its build and ``_clients``; never held across I/O.
        self._lock = threading.Lock()
        self._cluster: Any = None
        self._build: _Build | None = None  # the cluster client being built, if any
        self._build_failed_until = 0.0  # a failed build is not retried before this
        self._build_error = ""
        # Our own client per primary: the cluster client's node clients drop
        # connection keywords it does not know (``command_packer``).
        self._clients: dict[str, redis.Redis] = {}
        self._down_until: dict[str, float] = {}
        self._returning: set[str] = set()  # retried after an outage, not yet answered

    def _topology(self) -> Any:
        """The cluster client, built on first use (building it asks a node for the slots).

        One caller builds it; the others wait for that build at most
        ``remote_timeout``. After a failed build, calls raise ``StoreError`` at
        once for ``remote_retry_interval`` instead of building it again."""
        cluster = self._cluster
        if cluster is not None:
            return cluster
        with self._lock:
            if self._cluster is not None:
                return self._cluster
            build = self._build
            if build is None:
                remaining = self._build_failed_until - time.monotonic()
                if remaining > 0:
                    raise StoreError(
                        f"Redis Cluster {self._where} unreachable ({self._build_error}); "
                        f"retried in {remaining:.1f}s"
                    )
                build = self._build = _Build()
                building = True
            else:
                building = False
        if building:
            return self._build_cluster(build)
        if not build.done.wait(self.timeout):
            raise StoreError(f"Redis Cluster {self._where}: no slot map after {self.timeout}s")
        if build.cluster is None:
            raise StoreError(f"Redis Cluster {self._where} unreachable ({build.outcome})")
        return build.cluster

    def _build_cluster(self, build: _Build) -> Any:
        """Builds the cluster client outside the lock (each startup node in turn may
        take ``remote_timeout``) and publishes it, unless ``close`` ran meanwhile."""
        cluster = None
        try:
            try:
                cluster = self._new_cluster()
            except Exception as exc:
                build.outcome = str(exc) or type(exc).__name__
                with self._lock:
                    self._build_failed_until = time.monotonic() + self._retry_interval
                    self._build_error = build.outcome
                raise
            with self._lock:
                if self._build is build:  # else closed meanwhile: not ours to publish
                    if self._cluster is None:
                        self._cluster, cluster = cluster, None
                    build.cluster = self._cluster  # ours, or one published meanwhile
                else:
                    build.outcome = "the store was closed while it connected"
        finally:
            with self._lock:
                if self._build is build:
                    self._build = None
            build.done.set()
            if cluster is not None:  # not published: nobody else would close it
                cluster.close()
        if build.cluster is None:
            raise StoreError(f"Redis Cluster {self._where}: {build.outcome}")
        return build.cluster

    def _new_cluster(self) -> Any:
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in self._nodes.nodes],
            username=self._nodes.username,
            password=self._nodes.password,
            require_full_coverage=False,  # a shard down leaves the others usable
            **client_options(self.timeout),
        )

    def _node_of(self, key: str) -> Any:
        return self._topology().get_node_from_key(key)

    def _node_client(self, node: Any) -> redis.Redis:
        down = self._down_until.get(node.name)
        if down is not None:
            if time.monotonic() < down:
                if self._all_down():
                    raise StoreError("no Redis Cluster primary answers")
                raise ShardUnavailable(f"shard {node.name} is down")
            self._down_until.pop(node.name, None)
            self._returning.add(node.name)
        return self._client_of(node)

    def _client_of(self, node: Any) -> redis.Redis:
        client = self._clients.get(node.name)
        if client is None:
            with self._lock:
                client = self._clients.get(node.name)
                if client is None:
                    pool = redis.ConnectionPool(
                        host=node.host,
                        port=node.port,
                        username=self._nodes.username,
                        password=self._nodes.password,
                        **client_options(self.timeout),
                    )
                    client = self._clients[node.name] = redis.Redis(connection_pool=pool)
        return client

    def _answered(self, node: Any) -> None:
        if node.name not in self._returning:
            return
        self._returning.discard(node.name)
        logger.warning("Redis Cluster shard %s available again", node.name)
        callback = self.on_shard_back
        if callback is not None:
            try:
                callback()
            except Exception as exc:
                logger.warning("Shard recovery hook failed: %s", exc)

    def _shard_failed(self, node: Any, exc: BaseException) -> ShardUnavailable:
        still_down = node.name in self._returning or node.name in self._down_until
        self._returning.discard(node.name)
        if not still_down:  # logged once per outage
            logger.warning(
                "Redis Cluster shard %s unavailable (%s); its keys miss, retried in %.1fs",
                node.name,
                exc,
                self._retry_interval,
            )
        self._down_until[node.name] = time.monotonic() + self._retry_interval
        if self._all_down():
            return StoreError(f"no Redis Cluster primary answers (last: {node.name}: {exc})")
        return ShardUnavailable(f"shard {node.name}: {exc}")

    def _all_down(self) -> bool:
        """Every primary failed recently: the store is down, not a shard."""
        primaries = self._topology().get_primaries()
        return bool(primaries) and all(node.name in self._down_until for node in primaries)

    def _run(self, key: str, call: Any) -> Any:
        """``call(client)`` on the primary owning ``key``; one retry after a slot move."""
        for attempt in (0, 1):
            node = self._node_of(key)
            client = self._node_client(node)
            try:
                result = call(client)
            except _NODE_ERRORS as exc:
                raise self._shard_failed(node, exc) from exc
            except ResponseError as exc:
                if attempt or not str(exc).startswith(("MOVED", "ASK")):
                    raise
                self._topology().nodes_manager.initialize()  # the slots moved
                continue
            self._answered(node)
            return result
        raise AssertionError("unreachable")

    def exists(self, name: str) -> bool:
        key = redis_data_key(name)
        return bool(self._run(key, lambda c: c.exists(key)))

    def get(self, name: str) -> bytes | None:
        key = redis_data_key(name)

        def read(client: redis.Redis) -> Any:
            pipe = client.pipeline(transaction=False)
            _queue_read(pipe, key, self.max_frame)
            replies = pipe.execute(raise_on_error=False)
            for reply in replies:  # a slot move: _run asks again
                if isinstance(reply, ResponseError) and str(reply).startswith(("MOVED", "ASK")):
                    raise reply
            return replies

        return bounded_frame(name, _present_value(self._run(key, read)), self.max_frame)

    def _per_node(
        self, keys: Sequence[str], command: str, queue: Callable[[Any, str], None] | None = None
    ) -> list[Any]:
        """``command`` of each key, one pipeline per primary; None for down shards.

        ``queue(pipe, key)``: several commands per key instead; the key's answer
        is then the list of their replies (None if any failed)."""
        groups: dict[str, tuple[Any, list[int]]] = {}
        for index, key in enumerate(keys):
            node = self._node_of(key)
            groups.setdefault(node.name, (node, []))[1].append(index)
        answers: list[Any] = [None] * len(keys)
        for node, indices in groups.values():
            try:
                pipe = self._node_client(node).pipeline(transaction=False)
                for index in indices:
                    if queue is None:
                        getattr(pipe, command)(keys[index])
                    else:
                        queue(pipe, keys[index])
                replies = pipe.execute(raise_on_error=False)
            except ShardUnavailable:
                continue
            except StoreError:
                raise
            except _NODE_ERRORS as exc:
                failure = self._shard_failed(node, exc)
                if not isinstance(failure, ShardUnavailable):
                    raise failure from exc
                continue
            self._answered(node)
            if queue is not None:  # group each key's replies
                per_key = len(replies) // max(len(indices), 1)
                replies = [
                    None if any(_failed(r) for r in group) else group
                    for group in (
                        replies[i * per_key : (i + 1) * per_key] for i in range(len(indices))
                    )
                ]
            for index, reply in zip(indices, replies, strict=True):
                # A MOVED reply (resharding) is a miss now; the map is refreshed below.
                answers[index] = None if isinstance(reply, Exception) else reply
            if any(reply is None or isinstance(reply, ResponseError) for reply in replies):
                self._topology().nodes_manager.initialize()
        return answers

    def exists_many(self, names: Sequence[str]) -> list[bool | None]:
        found = self._per_node([redis_data_key(name) for name in names], "exists")
        return [None if answer is None else bool(answer) for answer in found]

    def get_many(self, names: Sequence[str]) -> list[bytes | None]:
        keys = [redis_data_key(name) for name in names]
        replies = self._per_node(keys, "read", lambda p, k: _queue_read(p, k, self.max_frame))
        return [
            bounded_frame(name, _present_value(reply), self.max_frame)
            for name, reply in zip(names, replies, strict=True)
        ]

    def put(self, name: str, data: bytes | memoryview) -> None:
        # The two keys live in different slots: data first, metadata last
        # (existence is the frame's, so a reader never sees a partial entry).
        data_key, meta_key = redis_data_key(name), redis_meta_key(name)
        self._run(data_key, lambda c: c.set(data_key, data))
        self._run(meta_key, lambda c: c.set(meta_key, _metadata(len(data))))

    def delete(self, name: str) -> bool:
        data_key, meta_key = redis_data_key(name), redis_meta_key(name)
        removed = self._run(data_key, lambda c: c.delete(data_key))
        self._run(meta_key, lambda c: c.delete(meta_key))
        return removed > 0

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        # A name's metadata and data keys live in different slots: scan each
        # primary for metadata keys, then size the frames wherever they are.
        for node in self._topology().get_primaries():
            try:
                batches = list(_scan(self._node_client(node), prefix))
            except _NODE_ERRORS as exc:
                raise self._shard_failed(node, exc) from exc
            for names in batches:
                sizes = self._per_node([redis_data_key(name) for name in names], "strlen")
                if any(size is None for size in sizes):
                    raise ShardUnavailable("a shard did not answer: the listing is partial")
                yield from _sized(names, sizes)

    def read_range(self, name: str, start: int, length: int) -> bytes | None:
        key = redis_data_key(name)

        def read(client: redis.Redis) -> Any:
            pipe = client.pipeline(transaction=False)
            pipe.exists(key)
            pipe.getrange(key, start, start + length - 1)
            return pipe.execute()

        present, data = self._run(key, read)
        return bytes(data) if present else None

    def read_log(self, name: str, size: int) -> bytes | None:
        return bytes(self._run(name, lambda c: c.getrange(name, -size, -1))) or None

    def append_log(self, name: str, line: bytes, limit: int) -> None:
        self._run(name, lambda c: c.eval(APPEND_LOG, 1, name, line, limit))

    def claim(self, name: str, ttl_s: float) -> bool:
        key, args = claim_key(name), [self.claim_owner, max(1, int(ttl_s * 1000))]
        return bool(self._run(key, lambda c: CLAIM(keys=[key], args=args, client=c)))

    def release(self, name: str) -> None:
        key = claim_key(name)
        self._run(key, lambda c: RELEASE(keys=[key], args=[self.claim_owner], client=c))

    def ping(self) -> None:
        """Answers if any primary does: a down shard alone is not a down tier."""
        failures: list[str] = []
        cluster = self._topology()
        for node in cluster.get_primaries():
            try:
                self._client_of(node).ping()
                return
            except _NODE_ERRORS as exc:
                failures.append(f"{node.name}: {exc}")
        raise RedisConnectionError("no cluster primary answers: " + "; ".join(failures))

    def close(self) -> None:
        # Never waits for a build in progress: its builder closes what it built.
        with self._lock:
            cluster, self._cluster = self._cluster, None
            clients, self._clients = list(self._clients.values()), {}
            self._build = None
        for client in clients:
            client.connection_pool.disconnect()
        if cluster is not None:
            cluster.close()

    def abort(self) -> None:
        with self._lock:
            cluster, clients = self._cluster, list(self._clients.values())
        for client in clients:
            client.connection_pool.disconnect()
        if cluster is not None:
            cluster.disconnect_connection_pools()

    def describe(self) -> str:
        return self._where


def open_redis_cluster(settings: RemoteSettings) -> RedisClusterStore:
    return RedisClusterStore(parse_node_list(settings.url, service=False), settings)
