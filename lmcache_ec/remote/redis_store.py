"""Redis stores: standalone (``redis://``, ``rediss://``, ``unix://``) and
Sentinel (``redis-sentinel://``), and what Redis Cluster shares with them.

Keys as LMCache's ``RedisConnector`` writes them (``remote_names.py``), so entries
are interchangeable with a plain LMCache writer. Every client has connect and
read timeouts of ``remote_timeout`` and retries once, on a refused or reset
connection only (a server restart drops pooled connections).

Reads are bounded (``bounded.py``): an entry's value is read with
``GETRANGE 0 max_frame_bytes`` (beside ``EXISTS``, in the same round trip),
never ``GET``, so a padded value costs at most ``max_frame_bytes + 1`` bytes.

Redis Cluster (``redis-cluster://``) is ``redis_cluster.py``, on the helpers here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
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
    REDIS_DATA_SUFFIX,
    claim_key,
    parse_node_list,
    redact,
    redis_data_key,
    redis_meta_key,
)
from .bounded import bounded_frame
from .sentinel_watch import PrimaryWatch
from .store import READ_BATCH, RemoteStore, Replication

logger = logging.getLogger(__name__)

# Entries per pipeline in batched reads: one round trip for a typical request's
# items, while a single reply stays bounded (32 x 1.3 MB frames = 42 MB).
MGET_BATCH = READ_BATCH
SCAN_BATCH = 500
# The write ``replicate`` waits for: no entry, claim or log name (never listed).
REPLICATION_MARK = "lmcache-ec.replication-mark"
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
    """Batches of entry names whose frame (data) key ``client``'s server holds.

    The frame key is the entry: every read looks only at it, and its metadata
    key may be gone (evicted first by ``allkeys-lru``: it is never read; on a
    cluster, its shard was down during the put). A metadata key without a
    frame is no entry.
    """
    pattern = _glob_escape(prefix) + "*" + REDIS_DATA_SUFFIX
    batch: list[str] = []
    for raw in client.scan_iter(match=pattern, count=SCAN_BATCH):
        name = raw.decode()[: -len(REDIS_DATA_SUFFIX)]
        if ECKey.is_storage_name(name):
            batch.append(name)
        if len(batch) >= SCAN_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _sized(names: list[str], sizes: Sequence[Any]) -> Iterator[tuple[str, int]]:
    """(name, frame bytes) from each name's STRLEN reply.

    A data key of another type is a damaged entry: listed with size 0 (its
    header read fails: unreadable, and purgeable), never a failed listing.
    Any other error reply raises (a partial listing must not look complete).
    """
    for name, size in zip(names, sizes, strict=True):
        if _wrong_type(size):
            yield name, 0
        elif _failed(size):
            raise size
        elif size:  # 0: deleted since the scan (or empty: a miss, removed when read)
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

    def __init__(
        self,
        client: redis.Redis,
        timeout: float,
        where: str,
        max_frame: int,
        watch: PrimaryWatch | None = None,
    ) -> None:
        self.timeout = timeout
        self.max_frame = max_frame
        self._client = client
        self._where = where
        self._watch = watch  # Sentinel: the PrimaryWatch following the primary

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
            # One damaged key fails only itself (``_sized``), not the whole listing.
            yield from _sized(names, pipe.execute(raise_on_error=False))

    def read_range(self, name: str, start: int, length: int) -> bytes | None:
        key = redis_data_key(name)
        pipe = self._client.pipeline(transaction=False)
        pipe.exists(key)
        pipe.getrange(key, start, start + length - 1)
        # Unraised: redis-py prefixes a raised reply ("Command # 2 … caused
        # error: WRONGTYPE …"), which would hide a key of another type (damage).
        present, data = pipe.execute(raise_on_error=False)
        for reply in (present, data):
            if isinstance(reply, Exception):
                raise reply
        return _as_bytes(data) if present else None

    def read_log(self, name: str, size: int) -> bytes | None:
        # An empty log holds no record: absent or empty read alike (one command).
        return _as_bytes(self._client.getrange(name, -size, -1)) or None

    def append_log(self, name: str, line: bytes, limit: int) -> None:
        self._client.eval(APPEND_LOG, 1, name, line, limit)

    def replicate(self, timeout_s: float) -> Replication | None:
        replicas = int(self._client.info("replication").get("connected_slaves", 0))
        if replicas == 0:
            return None
        wait_ms = max(1, int(timeout_s * 1000))
        with self._client.pipeline(transaction=False) as pipe:
            # WAIT waits for the replication offset its connection last saw (Redis
            # 7.0: after any command; later releases: after its own writes): a write
            # made here, after every earlier one in the stream, covers them all.
            pipe.set(REPLICATION_MARK, b"", px=wait_ms + 60_000)
            pipe.wait(replicas, wait_ms)
            acked = pipe.execute()[1]
        return Replication(int(acked), replicas)

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
        if self._watch is not None:
            self._watch.close()
        self._client.close()

    def abort(self) -> None:
        self._client.connection_pool.disconnect()

    def describe(self) -> str:
        return self._where


def _wrong_type(reply: Any) -> bool:
    """A reply saying the key holds another type than a string (not an outage)."""
    return isinstance(reply, ResponseError) and str(reply).startswith("WRONGTYPE")


def _failed(reply: Any) -> bool:
    """An error reply that says nothing about the entry (the server's state)."""
    return isinstance(reply, Exception) and not _wrong_type(reply)


def _as_bytes(reply: Any) -> bytes:
    """A GETRANGE reply; anything but bytes (a broken server's integer, which
    ``bytes()`` would turn into that many zeros) reads as nothing."""
    return reply if isinstance(reply, bytes) else b""


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
    watch = PrimaryWatch(client.connection_pool, settings.retry_interval)
    where = redact(settings.url)
    return RedisStore(client, settings.timeout, where, settings.max_frame_bytes, watch)
