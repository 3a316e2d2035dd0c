"""``ECStoreConnector``: any ``RemoteStore`` as an LMCache ``RemoteConnector``.

What ``ECRemoteBackend`` talks to. Thin: the store does the I/O, this adds
LMCache's key type and CPU buffers.

- blocking calls (``exists_sync``, ``get_frame_sync``, ``get_frames_sync``,
  ``get_sync``, ``remove_sync``) run in the caller's thread, bounded by the
  store's client timeouts;
- uploads (``submit`` of ``send_frame``) run on a small private thread
  pool, queued by the caller's thread itself: the job holds a reference to
  the CPU buffer it sends and releases it when done, so the bytes are read in
  place, never copied;
- the async ones (upstream's interface: ``put``, probes) run on the same
  pool. Bytes cross that thread boundary as private copies: a call abandoned
  after a timeout can neither leak a CPU buffer nor read one that has been
  reused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

from .buffers import byte_view, fill_frame_buffer, frame_buffer_size
from .store import RemoteStore

logger = logging.getLogger(__name__)

WORKERS = 4
T = TypeVar("T")


class ECStoreConnector(RemoteConnector):
    def __init__(
        self,
        store: RemoteStore,
        loop: asyncio.AbstractEventLoop,
        local_cpu_backend: LocalCPUBackend,
    ) -> None:
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.store = store
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self._executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="ec-remote")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._executor.submit(fn, *args), loop=self.loop)

    # -- reads ---------------------------------------------------------------

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._run(self.store.exists, key.to_string())

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self.store.exists(key.to_string())

    def get_frame_sync(self, key: CacheEngineKey) -> bytes | None:
        """The stored frame as bytes, read in the caller's thread; no CPU buffer."""
        return self.store.get(key.to_string())

    def get_frames_sync(self, keys: list[CacheEngineKey]) -> list[bytes | None]:
        """``get_frame_sync`` for several keys in as few round trips as the store allows."""
        return self.store.get_many([key.to_string() for key in keys])

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        data = await self._run(self.store.get, key.to_string())
        # No await below: a cancellation cannot strand the allocated buffer.
        return self._to_memory_obj(key, data)

    def get_sync(self, key: CacheEngineKey) -> MemoryObj | None:
        return self._to_memory_obj(key, self.store.get(key.to_string()))

    def _to_memory_obj(self, key: CacheEngineKey, data: bytes | None) -> MemoryObj | None:
        if data is None:
            return None
        memory_obj = self.local_cpu_backend.allocate(
            torch.Size([frame_buffer_size(data)]), torch.uint8, MemoryFormat.EC_TD, busy_loop=False
        )
        if memory_obj is None:
            logger.warning("CPU pool full: remote read of %s skipped", key.to_string())
            return None
        fill_frame_buffer(memory_obj, data)
        return memory_obj

    # -- writes --------------------------------------------------------------

    def support_batched_put(self) -> bool:
        return False  # the backend submits (and de-duplicates) per key

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        # Copied here, on the loop: the caller releases memory_obj when we return.
        await self._run(self.store.put, key.to_string(), bytes(byte_view(memory_obj)))

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``fn`` on the store's threads; the caller only wakes one of them."""
        return self._executor.submit(fn, *args)

    def send_frame(self, key: CacheEngineKey, memory_obj: MemoryObj) -> bool:
        """Send the frame unless the store has it; False if it was there.

        Blocking, bounded by the store's timeouts. The caller holds a reference
        to ``memory_obj`` until this returns: its bytes are sent in place.
        """
        name = key.to_string()
        if self.store.exists(name):
            return False
        self.store.put(name, byte_view(memory_obj))
        return True

    def remove_sync(self, key: CacheEngineKey) -> bool:
        return self.store.delete(key.to_string())

    async def list(self) -> list[str]:
        return await self._run(lambda: [name for name, _ in self.store.list()])

    # -- health and lifecycle -------------------------------------------------

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        await self._run(self.store.ping)
        return 0

    def abort(self) -> None:
        """Cut the store's connections: ends a read its caller gave up on."""
        self.store.abort()

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.store.close()

    def __repr__(self) -> str:
        return f"<ECStoreConnector {self.store.describe()}>"
