"""LMCache's ``RedisConnector`` with bounded calls and a ``close`` that returns.

Same keys and metadata as upstream (``naming.py``), so entries written here
and by a plain LMCache redis:// writer are interchangeable. What changes:

- the connection pool has connect/read timeouts and retries once, on a
  refused or reset connection only (a server restart drops pooled
  connections);
- ``get``/``exists``/``put`` run directly on the event loop instead of
  upstream's priority-queue executor: a queued job keeps running after its
  caller gave up, and a late ``get`` then leaks its CPU buffer;
- blocking reads (``get_sync``, ``exists_sync``, ``remove_sync``) use a
  synchronous client in the caller's thread, bounded by socket timeouts;
- a read is one round trip (``MGET`` of metadata and data) and never
  busy-waits for CPU memory;
- ``put`` writes data and metadata in one ``MULTI``/``EXEC``, so a reader
  never sees metadata without data;
- ``ping`` (health probe), ``remove_sync`` (bounded), and ``close`` without
  upstream's self-deadlock (its ``close`` blocks the event-loop thread on a
  future that only that thread can complete).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import redis as sync_redis
import redis.asyncio as redis
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.redis_connector import RedisConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from .naming import redis_data_key, redis_meta_key

logger = logging.getLogger(__name__)
_CORRUPT = object()


def byte_view(memory_obj: MemoryObj) -> memoryview:
    """A flat, writable ``B`` view of a memory object's bytes."""
    view = memory_obj.byte_array
    view = view if isinstance(view, memoryview) else memoryview(view)
    return view.cast("B") if view.format != "B" else view


class ECRedisConnector(RedisConnector):
    def __init__(
        self,
        url: str,
        loop: asyncio.AbstractEventLoop,
        local_cpu_backend: LocalCPUBackend,
        timeout: float,
    ) -> None:
        super().__init__(url, loop, local_cpu_backend)
        self.timeout = timeout
        options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        }
        # Replaces upstream's pool (built without timeouts, never connected).
        self.pool = redis.ConnectionPool.from_url(
            url, max_connections=self.max_connections, **options
        )
        self.connection = redis.Redis.from_pool(self.pool)
        # Blocking reads run in the caller's thread: the event-loop round trip
        # and asyncio's chunked reads cost about as much as the GET itself.
        self.sync_connection = sync_redis.Redis.from_url(url, **options)

    # -- reads ---------------------------------------------------------------

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._exists(key)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        """Blocking existence check in the caller's thread (socket timeouts bound it)."""
        return bool(self.sync_connection.exists(redis_meta_key(key.to_string())))

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return await self._get(key)

    async def _get(self, key: CacheEngineKey) -> MemoryObj | None:
        name = key.to_string()
        async with self.sem:
            meta_raw, data = await self.connection.mget(redis_meta_key(name), redis_data_key(name))
        memory_obj = self._to_memory_obj(name, meta_raw, data)
        if memory_obj is _CORRUPT:
            await self._delete(name)
            return None
        return memory_obj

    def get_sync(self, key: CacheEngineKey) -> MemoryObj | None:
        """Blocking read in the caller's thread (socket timeouts bound it)."""
        name = key.to_string()
        meta_raw, data = self.sync_connection.mget(redis_meta_key(name), redis_data_key(name))
        memory_obj = self._to_memory_obj(name, meta_raw, data)
        if memory_obj is _CORRUPT:
            self.sync_connection.delete(redis_data_key(name), redis_meta_key(name))
            return None
        return memory_obj

    def _to_memory_obj(self, name: str, meta_raw: Any, data: Any) -> Any:
        """A CPU buffer holding ``data``; None on a miss, ``_CORRUPT`` to delete the entry."""
        if meta_raw is None:
            return None
        if data is None:  # data evicted by Redis: drop the orphan, or it blocks re-uploads
            logger.info("Remote entry %s lost its data; removing its metadata", name)
            return _CORRUPT
        try:
            metadata = RemoteMetadata.deserialize(memoryview(meta_raw))
        except Exception as exc:
            logger.warning("Unreadable remote metadata for %s (%s): removing it", name, exc)
            return _CORRUPT
        if metadata.length != len(data):
            logger.warning("Remote entry %s: metadata length disagrees with data", name)
            return _CORRUPT
        memory_obj = self.local_cpu_backend.allocate(
            metadata.shapes, metadata.dtypes, metadata.fmt, busy_loop=False
        )
        if memory_obj is None:
            logger.warning("CPU pool full: remote read of %s skipped", name)
            return None
        view = byte_view(memory_obj)
        if len(view) != metadata.length:
            memory_obj.ref_count_down()
            logger.warning("Remote entry %s: shape disagrees with its length", name)
            return _CORRUPT
        view[:] = data
        return memory_obj

    # -- writes --------------------------------------------------------------

    def support_batched_put(self) -> bool:
        return False  # the backend submits (and de-duplicates) per key

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self._put(key, memory_obj)

    async def _put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        data = byte_view(memory_obj)
        metadata = RemoteMetadata(
            len(data),
            memory_obj.get_shapes(),
            memory_obj.get_dtypes(),
            memory_obj.get_memory_format(),
        ).serialize()
        name = key.to_string()
        async with self.sem, self.connection.pipeline(transaction=True) as pipe:
            pipe.set(redis_data_key(name), data)
            pipe.set(redis_meta_key(name), metadata)
            await pipe.execute()

    async def _delete(self, name: str) -> bool:
        async with self.sem:
            return await self.connection.delete(redis_data_key(name), redis_meta_key(name)) > 0

    def remove_sync(self, key: CacheEngineKey) -> bool:
        name = key.to_string()
        return self.sync_connection.delete(redis_data_key(name), redis_meta_key(name)) > 0

    # -- health and lifecycle -------------------------------------------------

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        await self.connection.ping()
        return 0

    async def close(self) -> None:
        await self.pq_executor.shutdown_async(wait=False)
        self.sync_connection.close()
        await self.connection.aclose()
        logger.info("Closed the redis connection")

    def __repr__(self) -> str:
        kwargs: dict[str, Any] = self.pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        return f"<ECRedisConnector {where}>"
