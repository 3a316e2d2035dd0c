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
  reused;
- every job of that pool is bounded as a whole (``Deadline``:
  ``remote_timeout`` + 0.5 s, then the store's connections are cut), not only
  per socket read: a server that drips its reply to a write holds no upload
  past the bound. The pool's threads are daemon threads, so a call that
  cannot be cut (S3) never keeps the process from exiting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

from .buffers import byte_view, fill_frame_buffer, frame_buffer_size
from .deadline import GRACE, DaemonPool, Deadline, LateAnswer
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
        self._executor = DaemonPool(WORKERS, "ec-remote")
        # Twice the pool: a call given up on may hold its thread until the cut ends it.
        self._bound = Deadline(store.timeout + GRACE, store.abort, 2 * WORKERS, "ec-remote-call")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        future = self._executor.submit(self._bound.run, fn, *args)
        return await asyncio.wrap_future(future, loop=self.loop)

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

        Blocking; the existence check and the write are waited for at most
        ``remote_timeout`` + 0.5 s together (``LateAnswer`` past it), on one
        thread hand-off (two cost the caller's concurrent puts ~30% in GIL
        switches). The caller holds a reference to ``memory_obj`` until this
        returns: its bytes are sent in place.
        """
        # The upload's own reference: one given up on may still be sending
        # from the buffer, which must not be reused until it ends (``late``).
        memory_obj.ref_count_up()
        try:
            sent = self._bound.run(
                self._send_unless_stored, key.to_string(), memory_obj, late=_release(memory_obj)
            )
        except LateAnswer:
            raise  # released by ``late`` once the abandoned upload ends
        except BaseException:
            memory_obj.ref_count_down()
            raise
        memory_obj.ref_count_down()
        return sent

    def _send_unless_stored(self, name: str, memory_obj: MemoryObj) -> bool:
        if self.store.exists(name):
            return False
        self.store.put(name, byte_view(memory_obj))
        return True

    def remove_sync(self, key: CacheEngineKey) -> bool:
        return self.store.delete(key.to_string())

    def remove_damaged_sync(self, key: CacheEngineKey) -> bool:
        return self.store.delete_damaged(key.to_string())

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
        self._executor.shutdown()
        self._bound.close()
        self.store.close()  # cuts the connections (Redis): calls in flight end now

    def __repr__(self) -> str:
        return f"<ECStoreConnector {self.store.describe()}>"


def _release(memory_obj: MemoryObj) -> Callable[[Future[Any]], None]:
    return lambda _: memory_obj.ref_count_down()
