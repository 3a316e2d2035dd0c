"""RemoteCatalog: what the remote tier holds, without an LMCache engine.

For processes that must look at the remote store but not serve from it: the
vLLM scheduler (existence checks before scheduling a load), the CLI (``ls``,
``purge``, ``stats``). Built directly on redis-py / boto3 with the object
naming of ``naming.py``, so it sees exactly what the serving path wrote, and
it allocates no LMCache memory pool.

Contract: every call is bounded by the config's ``remote_timeout`` (one
attempt, no retries; a reconnect happens on the next call). ``exists`` and
``delete`` return False and ``read_header`` returns None when the store fails
or the entry is absent or unreadable; ``list`` raises ``RemoteCatalogError``
(a partial listing must not look complete). Thread-safe.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

import torch

from .. import codec
from ..config import ECConfig
from ..key import ECKey
from .naming import (
    REDIS_META_SUFFIX,
    REDIS_SCHEMES,
    S3_SCHEME,
    redis_data_key,
    redis_meta_key,
    scheme_of,
)
from .s3_client import S3Settings, is_not_found, make_client

logger = logging.getLogger(__name__)

HEADER_READ_AHEAD = 4096  # one ranged read covers the prefix and a typical header
_SCAN_BATCH = 500


_S3_LOOKUP_THREADS = 8


class RemoteCatalogError(OSError):
    """The remote store could not be listed."""


class RemoteCatalog(abc.ABC):
    """Existence, listing, headers and deletion of entries in the remote tier."""

    timeout: float

    def exists(self, storage_name: str) -> bool:
        """True if the entry is stored; False if absent or on any error."""
        present = self.lookup(storage_name)
        if present is None:
            logger.warning("Remote lookup of %s failed", storage_name)
        return bool(present)

    @abc.abstractmethod
    def lookup(self, storage_name: str) -> bool | None:
        """True if stored, False if absent, None if the store could not answer."""

    def lookup_many(self, storage_names: list[str]) -> list[bool | None]:
        """``lookup`` of each name; stores override it to answer in one round trip."""
        return [self.lookup(name) for name in storage_names]

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """(storage name, frame bytes) of entries whose name starts with ``prefix``."""

    @abc.abstractmethod
    def _read_range(self, storage_name: str, start: int, length: int) -> bytes | None:
        """Up to ``length`` bytes of the frame from ``start``; None if absent."""

    @abc.abstractmethod
    def delete(self, storage_name: str) -> bool:
        """Remove the entry; True if it existed, False if absent or on error."""

    @abc.abstractmethod
    def read_object(self, name: str) -> bytes | None:
        """A small non-entry object (the purge marker); None if absent, raises on failure."""

    @abc.abstractmethod
    def write_object(self, name: str, data: bytes) -> None:
        """Store a small non-entry object under ``name``; raises on failure."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def read_header(self, storage_name: str) -> dict[str, Any] | None:
        """The verified frame header (``codec.read_header``), reading only its bytes.

        None if the entry is absent, unreadable, corrupt, or the store fails.
        """
        try:
            raw = self._read_range(storage_name, 0, HEADER_READ_AHEAD)
            if raw is None:
                return None
            header_len, *_ = codec.read_prefix(raw)
            needed = codec.PREFIX_SIZE + header_len
            if len(raw) < needed:
                rest = self._read_range(storage_name, len(raw), needed - len(raw))
                raw += rest or b""
            return codec.read_header(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        except codec.CorruptEntryError as exc:
            logger.info("Remote entry %s has an unreadable header: %s", storage_name, exc)
            return None
        except Exception as exc:
            logger.warning("Remote header read of %s failed: %s", storage_name, exc)
            return None

    def __enter__(self) -> RemoteCatalog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisCatalog(RemoteCatalog):
    def __init__(self, url: str, timeout: float) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.retry import Retry

        self.timeout = timeout
        # One retry, on refused/reset connections only: it replaces a pooled
        # connection the server dropped (restart) without doubling a timeout.
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            lib_name=None,  # no CLIENT SETINFO: two round trips per new connection
            lib_version=None,
        )

    def lookup(self, storage_name: str) -> bool | None:
        try:
            return bool(self._client.exists(redis_data_key(storage_name)))
        except Exception as exc:
            logger.debug("Remote exists(%s) failed: %s", storage_name, exc)
            return None

    def lookup_many(self, storage_names: list[str]) -> list[bool | None]:
        """One pipelined round trip of EXISTS; all None if it fails."""
        try:
            pipe = self._client.pipeline(transaction=False)
            for name in storage_names:
                pipe.exists(redis_data_key(name))
            return [bool(found) for found in pipe.execute()]
        except Exception as exc:
            logger.debug("Remote exists of %d entries failed: %s", len(storage_names), exc)
            return [None] * len(storage_names)

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        pattern = _glob_escape(prefix) + "*" + REDIS_META_SUFFIX
        try:
            batch: list[str] = []
            for raw in self._client.scan_iter(match=pattern, count=_SCAN_BATCH):
                name = raw.decode()[: -len(REDIS_META_SUFFIX)]
                if ECKey.is_storage_name(name):
                    batch.append(name)
                if len(batch) >= _SCAN_BATCH:
                    yield from self._sizes(batch)
                    batch = []
            yield from self._sizes(batch)
        except RemoteCatalogError:
            raise
        except Exception as exc:
            raise RemoteCatalogError(f"listing the Redis tier failed: {exc}") from exc

    def _sizes(self, names: list[str]) -> Iterator[tuple[str, int]]:
        if not names:
            return
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.strlen(redis_data_key(name))
        for name, size in zip(names, pipe.execute(), strict=True):
            if size:  # metadata without data: a torn write, not an entry
                yield name, int(size)

    def _read_range(self, storage_name: str, start: int, length: int) -> bytes | None:
        pipe = self._client.pipeline(transaction=False)
        pipe.exists(redis_data_key(storage_name))
        pipe.getrange(redis_data_key(storage_name), start, start + length - 1)
        present, data = pipe.execute()
        return bytes(data) if present else None

    def delete(self, storage_name: str) -> bool:
        try:
            removed = self._client.delete(
                redis_data_key(storage_name), redis_meta_key(storage_name)
            )
            return removed > 0
        except Exception as exc:
            logger.warning("Remote delete(%s) failed: %s", storage_name, exc)
            return False

    def read_object(self, name: str) -> bytes | None:
        data = self._client.get(name)
        return None if data is None else bytes(data)

    def write_object(self, name: str, data: bytes) -> None:
        self._client.set(name, data)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception as exc:
            logger.debug("Closing the Redis catalog: %s", exc)


class S3Catalog(RemoteCatalog):
    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        self.timeout = settings.timeout
        self._location = settings.location
        self._client = make_client(settings)
        self._pool: ThreadPoolExecutor | None = None

    def lookup_many(self, storage_names: list[str]) -> list[bool | None]:
        """HEAD requests side by side (S3 has no batch existence check)."""
        if len(storage_names) < 2:
            return [self.lookup(name) for name in storage_names]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_S3_LOOKUP_THREADS, thread_name_prefix="ec-s3-head")
        return list(self._pool.map(self.lookup, storage_names))

    def lookup(self, storage_name: str) -> bool | None:
        try:
            self._client.head_object(
                Bucket=self._location.bucket, Key=self._location.object_key(storage_name)
            )
            return True
        except Exception as exc:
            if is_not_found(exc):
                return False
            logger.debug("Remote exists(%s) failed: %s", storage_name, exc)
            return None

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(
                Bucket=self._location.bucket, Prefix=self._location.object_key(prefix)
            ):
                for item in page.get("Contents", []):
                    name = self._location.storage_name(item["Key"])
                    if name is not None and ECKey.is_storage_name(name):
                        yield name, int(item["Size"])
        except Exception as exc:
            raise RemoteCatalogError(f"listing the S3 tier failed: {exc}") from exc

    def _read_range(self, storage_name: str, start: int, length: int) -> bytes | None:
        try:
            response = self._client.get_object(
                Bucket=self._location.bucket,
                Key=self._location.object_key(storage_name),
                Range=f"bytes={start}-{start + length - 1}",
            )
        except Exception as exc:
            if is_not_found(exc):
                return None
            if "InvalidRange" in str(exc):  # start beyond a short (corrupt) object
                return b""
            raise
        with response["Body"] as body:
            return body.read()

    def delete(self, storage_name: str) -> bool:
        if not self.exists(storage_name):
            return False
        try:
            self._client.delete_object(
                Bucket=self._location.bucket, Key=self._location.object_key(storage_name)
            )
            return True
        except Exception as exc:
            logger.warning("Remote delete(%s) failed: %s", storage_name, exc)
            return False

    def read_object(self, name: str) -> bytes | None:
        try:
            response = self._client.get_object(
                Bucket=self._location.bucket, Key=self._location.object_key(name)
            )
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        with response["Body"] as body:
            return body.read()

    def write_object(self, name: str, data: bytes) -> None:
        self._client.put_object(
            Bucket=self._location.bucket, Key=self._location.object_key(name), Body=data
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        try:
            self._client.close()
        except Exception as exc:
            logger.debug("Closing the S3 catalog: %s", exc)


def open_catalog(config: ECConfig) -> RemoteCatalog | None:
    """The catalog of ``config``'s remote tier, or None when none is configured.

    Opening does not contact the server; failures show up per call.
    """
    url = config.values.get("remote_url")
    scheme = scheme_of(url)
    timeout = float(config.values.get("remote_timeout") or 2.0)
    if not url:
        return None
    if scheme in REDIS_SCHEMES:
        return RedisCatalog(url, timeout)
    if scheme == S3_SCHEME:
        return S3Catalog(S3Settings.from_values(config.values))
    raise ValueError(f"no catalog for remote_url scheme {scheme}://")


__all__ = ["RemoteCatalog", "RemoteCatalogError", "open_catalog"]
