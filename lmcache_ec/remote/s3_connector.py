"""``ECS3Connector``: an LMCache ``RemoteConnector`` for any S3-compatible store.

Loaded through LMCache's Remote Storage Plugin Framework
(``remote_storage_plugins: [ec_s3]`` plus ``extra_config``
``remote_storage_plugin.ec_s3.{module_path,class_name,bucket,prefix,
endpoint_url,region,addressing_style,timeout}``); ``ECConfig.to_lmcache``
writes those from ``remote_url: s3://bucket/prefix`` and the ``s3_*`` options.

Why not LMCache's ``s3://``: it sizes uploads and reads from the KV chunk
shape, has no endpoint or bucket option and disables itself for good after
three errors. Here one object per entry holds the frame
(``<prefix>/<storage_name>``); a read allocates exactly the object's size.

boto3 is blocking and every request is bounded by ``timeout`` (botocore
connect/read timeouts, no retries). Blocking calls (``get_sync``,
``exists_sync``, ``remove_sync``) run in the caller's thread; the async ones
(upstream's interface, used for uploads) on a small private thread pool.
Bytes cross that thread boundary as private copies: a call abandoned after a
timeout can neither leak a CPU buffer nor read one that has been reused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

from .redis_connector import byte_view, fill_frame_buffer, frame_buffer_size
from .s3_client import S3Settings, is_not_found, make_client

logger = logging.getLogger(__name__)

WORKERS = 8
T = TypeVar("T")


class ECS3Connector(RemoteConnector):
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        local_cpu_backend: LocalCPUBackend,
        config: LMCacheEngineConfig,
    ) -> None:
        super().__init__(config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.settings = S3Settings.from_extra_config(config.extra_config or {})
        self.location = self.settings.location
        self.timeout = self.settings.timeout
        self._client = make_client(self.settings, max_pool_connections=WORKERS)
        self._executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="ec-s3")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._executor.submit(fn, *args), loop=self.loop)

    def _object(self, key: CacheEngineKey) -> dict[str, str]:
        return {"Bucket": self.location.bucket, "Key": self.location.object_key(key.to_string())}

    # -- reads ---------------------------------------------------------------

    def _head(self, key: CacheEngineKey) -> bool:
        try:
            self._client.head_object(**self._object(key))
            return True
        except Exception as exc:
            if is_not_found(exc):
                return False
            raise

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._run(self._head, key)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self._head(key)

    def _read(self, key: CacheEngineKey) -> bytes | None:
        try:
            response = self._client.get_object(**self._object(key))
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        with response["Body"] as body:
            data = body.read()
        if len(data) != response["ContentLength"]:
            raise OSError(f"short read of {key.to_string()}")
        return data

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        data = await self._run(self._read, key)
        # No await below: a cancellation cannot strand the allocated buffer.
        return self._to_memory_obj(key, data)

    def get_frame_sync(self, key: CacheEngineKey) -> bytes | None:
        """The stored object as bytes, read in the caller's thread; no CPU buffer."""
        return self._read(key)

    def get_sync(self, key: CacheEngineKey) -> MemoryObj | None:
        """Blocking read in the caller's thread (botocore timeouts bound it)."""
        return self._to_memory_obj(key, self._read(key))

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

    def _write(self, key: CacheEngineKey, data: bytes) -> None:
        self._client.put_object(
            Body=data, ContentType="application/octet-stream", **self._object(key)
        )

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        # Copied here, on the loop: the caller releases memory_obj when we return.
        await self._run(self._write, key, bytes(byte_view(memory_obj)))

    def _delete(self, key: CacheEngineKey) -> bool:
        if not self._head(key):
            return False
        self._client.delete_object(**self._object(key))
        return True

    def remove_sync(self, key: CacheEngineKey) -> bool:
        return self._delete(key)

    def _list(self) -> list[str]:
        names: list[str] = []
        paginator = self._client.get_paginator("list_objects_v2")
        prefix = self.location.object_key("")
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                name = self.location.storage_name(item["Key"])
                if name is not None:
                    names.append(name)
        return names

    async def list(self) -> list[str]:
        return await self._run(self._list)

    # -- health and lifecycle -------------------------------------------------

    def support_ping(self) -> bool:
        return True

    def _head_bucket(self) -> int:
        self._client.head_bucket(Bucket=self.location.bucket)
        return 0

    async def ping(self) -> int:
        return await self._run(self._head_bucket)

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._client.close()
        logger.info("Closed the S3 connector")

    def __repr__(self) -> str:
        where = self.settings.endpoint_url or "aws"
        return f"<ECS3Connector {where} s3://{self.location.bucket}/{self.location.prefix}>"
