"""Redis stores: standalone (``redis://``, ``rediss://``, ``unix://``), Redis
Cluster (``redis-cluster://``) and Sentinel (``redis-sentinel://``).

Keys as LMCache's ``RedisConnector`` writes them (``remote_names.py``), so entries
are interchangeable with a plain LMCache writer. Every client has connect and
read timeouts of ``remote_timeout`` and retries once, on a refused or reset
connection only (a server restart drops pooled connections).

Reads are bounded (``bounded.py``): an entry's value is read with
``GETRANGE 0 max_frame_bytes`` (beside ``EXISTS``, in the same round trip),
never ``GET``, so a padded value costs at most ``max_frame_bytes + 1`` bytes.

Cluster: redis-py's ``RedisCluster`` keeps the slot map; each call goes to
the owning primary's own client, so a shard that is down costs only its own
keys: their calls raise ``ShardUnavailable`` (batched reads answer None for
them) and the shard is skipped at once for ``remote_retry_interval`` before
it is tried again. Batched reads send one pipeline per primary. The cluster
client is built on first use by one caller, outside any lock (it asks the
startup nodes in turn); other callers wait for it at most ``remote_timeout``,
and a failed build is not tried again for ``remote_retry_interval``: calls
meanwhile raise ``StoreError`` at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.connection import Encoder, PythonRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ..config import RemoteSettings
from ..key import ECKey
from ..remote_names import (
    REDIS_META_SUFFIX,
    NodeList,
    claim_key,
    parse_node_list,
    redact,
    redis_data_key,
    redis_meta_key,
)
from .bounded import bounded_frame
from .store import RemoteStore, ShardUnavailable, StoreError

logger = logging.getLogger(__name__)

# Entries per pipeline in batched reads: one round trip for a typical request's
# items, while a single reply stays bounded (32 x 1.3 MB frames = 42 MB).
MGET_BATCH = 32
SCAN_BATCH = 500
_NODE_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)

# A claim's value is its owner. Taken if free or already ours (renewed), and
# released only by its owner: compare-and-set/delete in one script, atomic
# on the server (on a cluster, on the primary owning the key).
CLAIM = Script(
    None,
    b"local held = redis.call('GET', KEYS[1])\n"
    b"if held and held ~= ARGV[1] then return 0 end\n"
    b"redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    b"return 1\n",
)
RELEASE = Script(
    None,
    b"if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n"
    b"return 0\n",
)


# redis-py's own packer sends a large value (a frame) from the caller's buffer
# as it is; the hiredis packer, its default when hiredis is installed, copies
# it twice first, at about 0.5 GB/s (a 4 MB SET took 8.5 ms instead of 1.5 ms
# on 127.0.0.1). Replies are still parsed by hiredis.
PACKER = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)


def client_options(timeout: float) -> dict[str, Any]:
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        # No CLIENT SETINFO on connect: two round trips per new connection.
        "lib_name": None,
        "lib_version": None,
        "command_packer": PACKER,
    }


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _metadata(length: int) -> bytes:
    """LMCache's ``RemoteMetadata`` of a frame: ``length`` uint8 bytes, EC format."""
    import torch
    from lmcache.v1 import protocol
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.protocol import RemoteMetadata

    if protocol.REMOTE_METADATA_FMT is None:
        # Set by RemoteBackend's constructor; a process with only a catalog has none.
        protocol.init_remote_metadata_info(1)
    return RemoteMetadata(
        length, [torch.Size([length])], [torch.uint8], MemoryFormat.EC_TD
    ).serialize()


def _scan(client: redis.Redis, prefix: str) -> Iterator[list[str]]:
    """Batches of entry names whose metadata key ``client``'s server holds."""
    pattern = _glob_escape(prefix) + "*" + REDIS_META_SUFFIX
    batch: list[str] = []
    for raw in client.scan_iter(match=pattern, count=SCAN_BATCH):
        name = raw.decode()[: -len(REDIS_META_SUFFIX)]
        if ECKey.is_storage_name(name):
            batch.append(name)
        if len(batch) >= SCAN_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _sized(names: list[str], sizes: Sequence[Any]) -> Iterator[tuple[str, int]]:
    for name, size in zip(names, sizes, strict=True):
        if size:  # metadata without data: a torn write, not an entry
            yield name, int(size)


# ``RemoteStore.append_log`` in one step on the server (``store.appended``): a
# newline after a damaged tail, the line, then the oldest whole lines dropped.
APPEND_LOG = """
local key, line, limit = KEYS[1], ARGV[1], tonumber(ARGV[2])
local size = redis.call('STRLEN', key)
if size > 0 and redis.call('GETRANGE', key, size - 1, size - 1) ~= '\\n' then
  size = redis.call('APPEND', key, '\\n')
end
size = redis.call('APPEND', key, line)
if size > limit then
  local region = redis.call('GETRANGE', key, size - limit - 1, size - #line - 1)
  local cut = string.find(region, '\\n', 1, true)
  if cut then
    redis.call('SET', key, redis.call('GETRANGE', key, size - limit - 1 + cut, -1))
  else
    redis.call('SET', key, line)
  end
end
return size
"""


def _queue_read(pipe: Any, key: str, limit: int) -> None:
    """The two commands of a bounded read of ``key`` (``_present_value`` takes their replies)."""
    pipe.exists(key)
    pipe.getrange(key, 0, limit)


class RedisStore(RemoteStore):
    """One Redis server (or the Sentinel-resolved primary) through one client."""

    def __init__(self, client: redis.Redis, timeout: float, where: str, max_frame: int) -> None:
        self.timeout = timeout
        self.max_frame = max_frame
        self._client = client
        self._where = where

    def exists(self, name: str) -> bool:
        return bool(self._client.exists(redis_data_key(name)))

    def exists_many(self, names: Sequence[str]) -> list[bool | None]:
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.exists(redis_data_key(name))
        return [bool(found) for found in pipe.execute()] if names else []

    def get(self, name: str) -> bytes | None:
        pipe = self._client.pipeline(transaction=False)
        _queue_read(pipe, redis_data_key(name), self.max_frame)
        replies = pipe.execute(raise_on_error=False)
        return bounded_frame(name, _present_value(replies), self.max_frame)

    def get_many(self, names: Sequence[str]) -> list[bytes | None]:
        frames: list[bytes | None] = []
        for first in range(0, len(names), MGET_BATCH):
            batch = names[first : first + MGET_BATCH]
            pipe = self._client.pipeline(transaction=False)
            for name in batch:
                _queue_read(pipe, redis_data_key(name), self.max_frame)
            replies = pipe.execute(raise_on_error=False)  # one bad key fails only itself
            frames += [
                bounded_frame(name, _present_value(replies[2 * i : 2 * i + 2]), self.max_frame)
                for i, name in enumerate(batch)
            ]
        return frames

    def put(self, name: str, data: bytes | memoryview) -> None:
        # One MULTI/EXEC: a reader never sees metadata without data.
        with self._client.pipeline(transaction=True) as pipe:
            pipe.set(redis_data_key(name), data)
            pipe.set(redis_meta_key(name), _metadata(len(data)))
            pipe.execute()

    def delete(self, name: str) -> bool:
        return self._client.delete(redis_data_key(name), redis_meta_key(name)) > 0

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        for names in _scan(self._client, prefix):
            pipe = self._client.pipeline(transaction=False)
            for name in names:
                pipe.strlen(redis_data_key(name))
            yield from _sized(names, pipe.execute())

    def read_range(self, name: str, start: int, length: int) -> bytes | None:
        key = redis_data_key(name)
        pipe = self._client.pipeline(transaction=False)
        pipe.exists(key)
        pipe.getrange(key, start, start + length - 1)
        present, data = pipe.execute()
        return bytes(data) if present else None

    def read_log(self, name: str, size: int) -> bytes | None:
        # An empty log holds no record: absent or empty read alike (one command).
        return bytes(self._client.getrange(name, -size, -1)) or None

    def append_log(self, name: str, line: bytes, limit: int) -> None:
        self._client.eval(APPEND_LOG, 1, name, line, limit)

    def claim(self, name: str, ttl_s: float) -> bool:
        # SET … PX inside the script: gone by itself when it expires.
        args = [self.claim_owner, max(1, int(ttl_s * 1000))]
        return bool(CLAIM(keys=[claim_key(name)], args=args, client=self._client))

    def claim_many(self, names: list[str], ttl_s: float) -> list[bool]:
        """``claim`` for several names in one round trip (a pipeline of the script)."""
        args = [self.claim_owner, max(1, int(ttl_s * 1000))]
        with self._client.pipeline(transaction=False) as pipe:
            for name in names:
                CLAIM(keys=[claim_key(name)], args=args, client=pipe)
            return [bool(won) for won in pipe.execute()]

    def release(self, name: str) -> None:
        RELEASE(keys=[claim_key(name)], args=[self.claim_owner], client=self._client)

    def ping(self) -> None:
        self._client.ping()

    def close(self) -> None:
        self._client.close()

    def describe(self) -> str:
        return self._where


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

    def describe(self) -> str:
        return self._where


def _wrong_type(reply: Any) -> bool:
    """A reply saying the key holds another type than a string (not an outage)."""
    return isinstance(reply, ResponseError) and str(reply).startswith("WRONGTYPE")


def _failed(reply: Any) -> bool:
    """An error reply that says nothing about the entry (the server's state)."""
    return isinstance(reply, Exception) and not _wrong_type(reply)


def _present_value(replies: Any) -> bytes | None:
    """The value of an ``EXISTS`` + ``GETRANGE`` pair of replies (None: absent).

    A key of another type, or a reply that is not a string (a hostile server),
    reads as an empty value: damage, which decoding rejects and the entry is
    removed, never an outage nor an allocation the reply asks for. Any other
    error reply raises.
    """
    if replies is None:
        return None
    present, data = replies
    for reply in replies:
        if _failed(reply):
            raise reply
    if not present:
        return None
    if _wrong_type(data) or not isinstance(data, (bytes, bytearray, memoryview)):
        return b""
    return bytes(data)


def open_redis(settings: RemoteSettings) -> RedisStore:
    client = redis.Redis.from_url(settings.url, **client_options(settings.timeout))
    return RedisStore(client, settings.timeout, redact(settings.url), settings.max_frame_bytes)


def open_redis_cluster(settings: RemoteSettings) -> RedisClusterStore:
    return RedisClusterStore(parse_node_list(settings.url, service=False), settings)


def open_redis_sentinel(settings: RemoteSettings) -> RedisStore:
    from redis.sentinel import Sentinel

    nodes = parse_node_list(settings.url, service=True)
    options = client_options(settings.timeout)
    sentinel = Sentinel(
        list(nodes.nodes),
        # No retries of its own: redis-py's default (10, with backoff) made one
        # read wait ~20 times remote_timeout on a sentinel that does not answer.
        sentinel_kwargs={
            "socket_timeout": options["socket_timeout"],
            "socket_connect_timeout": options["socket_connect_timeout"],
            "retry": Retry(NoBackoff(), 0),
        },
        username=nodes.username,
        password=nodes.password,
        **options,
    )
    client = sentinel.master_for(nodes.service, **options)
    return RedisStore(client, settings.timeout, redact(settings.url), settings.max_frame_bytes)
