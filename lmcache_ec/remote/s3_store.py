"""The S3 store (``s3://bucket/prefix``): any S3-compatible service through boto3.

One object per entry, ``<prefix>/<storage_name>``, holding the frame; its size
is the frame length. Credentials are never part of the settings: boto3 takes
them from the usual AWS chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, shared config files, instance or container roles);
``s3_endpoint_url`` points the client at MinIO, Ceph RGW, R2, moto …

Every request is bounded by ``remote_timeout`` (connect and read timeouts,
one attempt: the remote tier's health check decides when to try again).
Every read is bounded in size too (``bounded.py``): an entry is read as its
prefix, then at most the size the prefix declares plus one byte; a log (the
purge log) as a ranged read of its tail.

Why not LMCache's ``s3://`` connector: it sizes uploads and reads from the KV
chunk shape, has no endpoint or bucket option, and disables itself for good
after three errors.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from ..codec import PREFIX_SIZE
from ..config import RemoteSettings
from ..key import ECKey
from ..remote_names import S3Location, claim_key, parse_s3_url, redact
from .bounded import declared_or_none, too_large
from .deadline import DaemonPool
from .store import RemoteStore, StoreBusy, StoreError, appended

logger = logging.getLogger(__name__)

POOL_CONNECTIONS = 16  # upload threads of the connector + side-by-side lookups
_LOOKUP_THREADS = 8  # S3 has no batch existence check or read: requests side by side
_APPEND_TRIES = 32  # rounds of a log append racing others (each round, one of them wins)
_READS_REMEMBERED = 4096  # (ETag, size) of recent reads, to confirm a damaged one
# Replies refusing one call for now (throttling, a passing server error):
# misses, not an outage (S3 asks for fewer requests, not none).
_BUSY_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling"}
)
_BUSY_LOG_EVERY_S = 60.0
_PROBE_NAME = "ec-probe"  # never stored: the probe's read answers 404 when reads are allowed
# What a proxy or gateway answers instead of an object (an error page, an XML
# or JSON error with status 200): a failed call, never an entry's bytes.
_DOCUMENT_TYPES = ("text/", "html", "xml", "json")


# botocore's service models, loaded once a process (~0.5 s a client otherwise).
# No lock: a process may fork while another thread makes a client, and two
# threads making the first loader at once only load it twice.
_loader: Any = None


def _session() -> Any:
    """A new boto3 session (credentials resolved afresh) on the shared loader."""
    import boto3
    import botocore.loaders
    import botocore.session

    global _loader
    if _loader is None:
        _loader = botocore.loaders.create_loader()
    loader = _loader
    core = botocore.session.get_session()
    core.register_component("data_loader", loader)
    session = boto3.session.Session(botocore_session=core)
    # Each boto3 session appends its data directory to the loader's paths.
    loader.search_paths[:] = list(dict.fromkeys(loader.search_paths))
    return session


def make_client(settings: RemoteSettings, max_pool_connections: int = POOL_CONNECTIONS) -> Any:
    """A boto3 S3 client whose every request is bounded by ``settings.timeout``."""
    from botocore.config import Config

    style = settings.s3_addressing_style or ("path" if settings.s3_endpoint_url else "auto")
    config = Config(
        connect_timeout=settings.timeout,
        read_timeout=settings.timeout,
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        s3={"addressing_style": style},
    )
    return _session().client(
        "s3", endpoint_url=settings.s3_endpoint_url, region_name=settings.s3_region, config=config
    )


def _error_code(exc: BaseException) -> tuple[str, int | None]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", None
    code = str(response.get("Error", {}).get("Code", ""))
    return code, response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def is_not_found(exc: BaseException) -> bool:
    """True for a botocore ``ClientError`` meaning the object or bucket is absent."""
    code, status = _error_code(exc)
    return code in ("404", "NoSuchKey", "NotFound") or status == 404


def _is_busy(exc: BaseException) -> bool:
    code, status = _error_code(exc)
    return code in _BUSY_CODES or status in (500, 503)


def _is_precondition_failed(exc: BaseException) -> bool:
    code, status = _error_code(exc)
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


class S3Store(RemoteStore):
    def __init__(self, settings: RemoteSettings) -> None:
        self.settings = settings
        self.timeout = settings.timeout
        self.location: S3Location = parse_s3_url(settings.url)
        self._client = make_client(settings)
        self._pool: DaemonPool | None = None  # daemon: a call left dripping never holds the exit
        self._reads: OrderedDict[str, tuple[str, int]] = OrderedDict()  # name -> (ETag, size)
        self._lock = threading.Lock()  # guards _reads and the refused-call count
        self._busy_logged_at: float | None = None
        self._busy_since_log = 0

    def _object(self, name: str) -> dict[str, str]:
        return {"Bucket": self.location.bucket, "Key": self.location.object_key(name)}

    def _side_by_side(self, call: Any, names: Sequence[str]) -> list[Any]:
        """``call`` of each name; None for a name whose call S3 refused for now."""
        if len(names) < 2:
            return [_unless_busy(call, name) for name in names]
        if self._pool is None:
            self._pool = DaemonPool(_LOOKUP_THREADS, "ec-s3-many")
        futures = [self._pool.submit(_unless_busy, call, name) for name in names]
        return [future.result() for future in futures]

    def _failed(self, exc: Exception) -> NoReturn:
        """Raise ``exc``, or ``StoreBusy`` if S3 refused the call for now (one
        WARNING a minute says how many were refused)."""
        if not _is_busy(exc):
            raise exc
        now = time.monotonic()
        with self._lock:
            self._busy_since_log += 1
            due = self._busy_logged_at is None or now - self._busy_logged_at >= _BUSY_LOG_EVERY_S
            if due:
                refused, self._busy_since_log, self._busy_logged_at = self._busy_since_log, 0, now
        if due:
            logger.warning(
                "S3 refused %d call(s) for now (%s): they miss, the tier stays available",
                refused,
                _error_code(exc)[0] or exc,
            )
        raise StoreBusy(f"S3 refused the call for now: {exc}") from exc

    # -- entries ---------------------------------------------------------------

    def exists(self, name: str) -> bool:
        try:
            self._client.head_object(**self._object(name))
            return True
        except Exception as exc:
            if is_not_found(exc):
                return False
            self._failed(exc)

    def exists_many(self, names: Sequence[str]) -> list[bool | None]:
        return self._side_by_side(self.exists, names)

    def get(self, name: str) -> bytes | None:
        try:
            response = self._client.get_object(**self._object(name))
        except Exception as exc:
            if is_not_found(exc):
                return None
            self._failed(exc)
        length = int(response["ContentLength"])
        body = response["Body"]
        content_type = str(response.get("ContentType", "")).lower()
        if any(kind in content_type for kind in _DOCUMENT_TYPES):
            body.close()
            raise StoreError(f"{name} was answered with a document ({content_type}), not the entry")
        self._remember_read(name, str(response.get("ETag", "")), length)
        try:
            head = body.read(PREFIX_SIZE)
            declared = declared_or_none(head)
            if declared is None:
                return head  # not a frame: decoding rejects it
            if declared > self.settings.max_frame_bytes:
                too_large(name, declared, self.settings.max_frame_bytes)
                return None
            # One byte more than declared: a longer object is damaged, and shows it.
            data = head + body.read(declared + 1 - len(head))
        finally:
            body.close()
        if len(data) < min(length, declared + 1):
            raise OSError(f"short read of {name}")
        return data

    def get_many(self, names: Sequence[str]) -> list[bytes | None]:
        return self._side_by_side(self.get, names)

    def _remember_read(self, name: str, etag: str, length: int) -> None:
        with self._lock:
            self._reads[name] = (etag, length)
            self._reads.move_to_end(name)
            if len(self._reads) > _READS_REMEMBERED:
                self._reads.popitem(last=False)

    def delete_damaged(self, name: str) -> bool:
        """Deletes ``name`` only if the object stored now is the one read (same
        ETag and size): bytes damaged on the way (a proxy or gateway answering
        with another object or a wrong length) leave a good entry in place."""
        with self._lock:
            read = self._reads.pop(name, None)
        try:
            stored = self._client.head_object(**self._object(name))
        except Exception as exc:
            if is_not_found(exc):
                return False
            self._failed(exc)
        if read is None:  # its read is no longer remembered: unconfirmed, kept
            return False
        if read != (str(stored.get("ETag", "")), int(stored["ContentLength"])):
            logger.warning(
                "S3 entry %s kept: the damaged bytes read were not the object stored "
                "(its ETag or size differ): is a proxy or gateway changing answers?",
                name,
            )
            return False
        self._client.delete_object(**self._object(name))
        return True

    def put(self, name: str, data: bytes | memoryview) -> None:
        try:
            self._client.put_object(
                Body=bytes(data), ContentType="application/octet-stream", **self._object(name)
            )
        except Exception as exc:
            self._failed(exc)

    def delete(self, name: str) -> bool:
        if not self.exists(name):
            return False
        self._client.delete_object(**self._object(name))
        return True

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(
            Bucket=self.location.bucket, Prefix=self.location.object_key(prefix)
        )
        for page in pages:
            for item in page.get("Contents", []):
                name = self.location.storage_name(item["Key"])
                if name is not None and ECKey.is_storage_name(name):
                    yield name, int(item["Size"])

    def read_range(self, name: str, start: int, length: int) -> bytes | None:
        try:
            response = self._client.get_object(
                **self._object(name), Range=f"bytes={start}-{start + length - 1}"
            )
        except Exception as exc:
            if is_not_found(exc):
                return None
            if "InvalidRange" in str(exc):  # start beyond a short (corrupt) object
                return b""
            raise
        # A server (or proxy) that ignores Range sends the whole object: read
        # only up to the end of the range asked, and cut its start off.
        whole = "ContentRange" not in response
        with response["Body"] as body:
            data = body.read(start + length if whole else length)
        return data[start:] if whole else data

    # -- objects and claims ----------------------------------------------------

    def _read_tail(self, name: str, size: int) -> tuple[bytes, str] | None:
        """(the last ``size`` bytes of object ``name``, its ETag); None if absent."""
        try:
            response = self._client.get_object(**self._object(name), Range=f"bytes=-{size}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            if "InvalidRange" not in str(exc):
                raise
            try:  # an empty object: nothing to read, but its ETag for a conditional put
                return b"", self._client.head_object(**self._object(name))["ETag"]
            except Exception as again:
                if is_not_found(again):
                    return None
                raise
        body = response["Body"]
        try:
            return body.read(size), response["ETag"]
        finally:
            body.close()

    def read_log(self, name: str, size: int) -> bytes | None:
        found = self._read_tail(name, size)
        return None if found is None else found[0]

    def append_log(self, name: str, line: bytes, limit: int) -> None:
        """A conditional put on the ETag read (``If-None-Match: *`` for a new log):
        of appends made at the same time, one wins each round and the others
        read again and retry, so none is lost."""
        for attempt in range(_APPEND_TRIES):
            found = self._read_tail(name, limit + 1)
            if found is None:
                log, condition = b"", {"IfNoneMatch": "*"}
            else:
                log, condition = found[0], {"IfMatch": found[1]}
                if len(log) > limit:  # longer than any log we write: start at a whole line
                    log = log[log.find(b"\n") + 1 :]
            try:
                self._client.put_object(
                    Body=appended(log, line, limit), **condition, **self._object(name)
                )
                return
            except Exception as exc:
                if not _is_precondition_failed(exc) and not is_not_found(exc):
                    raise
            time.sleep(random.uniform(0, 0.01 * (attempt + 1)))  # another append got in
        raise StoreError(f"appending to {name}: it kept changing ({_APPEND_TRIES} tries)")

    def claim(self, name: str, ttl_s: float) -> bool:
        """Conditional put (``If-None-Match: *``); owner and expiry (wall clock)
        are in the object. A claim that expired, or is already ours, is
        replaced with ``If-Match`` on its ETag, so of several takers exactly
        one wins."""
        claim = self._object(claim_key(name))
        body = json.dumps({"owner": self.claim_owner, "expires": time.time() + ttl_s}).encode()
        try:
            self._client.put_object(Body=body, IfNoneMatch="*", **claim)
            return True
        except Exception as exc:
            if not _is_precondition_failed(exc):
                raise
        held = self._held_claim(claim)
        if held is None:
            return False  # released meanwhile: next caller's turn
        owner, expires, etag = held
        if owner != self.claim_owner and expires > time.time():
            return False
        try:
            self._client.put_object(Body=body, IfMatch=etag, **claim)
            return True
        except Exception as exc:
            if _is_precondition_failed(exc) or is_not_found(exc):
                return False
            raise

    def release(self, name: str) -> None:
        """Delete the claim only if it is ours, and only the version read
        (``If-Match`` on its ETag): a takeover in between is left alone."""
        claim = self._object(claim_key(name))
        held = self._held_claim(claim)
        if held is None or held[0] != self.claim_owner:
            return
        try:
            self._client.delete_object(IfMatch=held[2], **claim)
        except Exception as exc:
            if not (_is_precondition_failed(exc) or is_not_found(exc)):
                raise

    def _held_claim(self, claim: dict[str, str]) -> tuple[str, float, str] | None:
        """(owner, expires, ETag) of a claim object; None if absent. An
        unreadable one has no owner and has expired."""
        try:
            held = self._client.get_object(**claim)
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        with held["Body"] as stream:
            raw = stream.read(4096)
        try:
            record = json.loads(raw)
            owner, expires = str(record.get("owner", "")), float(record["expires"])
        except (ValueError, KeyError, TypeError, AttributeError):
            owner, expires = "", 0.0
        return owner, expires, held["ETag"]

    # -- lifecycle -------------------------------------------------------------

    def ping(self) -> None:
        """The bucket answers, and a read is allowed (a missing object's read
        answers 404, a denied one 403): a store that lets the probe in but
        refuses every read stays down rather than coming back each interval."""
        try:
            self._client.head_bucket(Bucket=self.location.bucket)
            try:
                self._client.head_object(**self._object(_PROBE_NAME))
            except Exception as exc:
                if not is_not_found(exc):
                    raise
        except Exception:
            # Credentials may have changed since the client was made (a rotated
            # or refreshed credentials file, a token that expired): the next
            # probe signs with what the AWS chain gives then.
            old, self._client = self._client, make_client(self.settings)
            old.close()
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        self._client.close()

    def describe(self) -> str:
        where = redact(self.settings.s3_endpoint_url) or "aws"
        return f"{where} s3://{self.location.bucket}/{self.location.prefix}"


def open_s3(settings: RemoteSettings) -> S3Store:
    return S3Store(settings)


def _unless_busy(call: Any, name: str) -> Any:
    try:
        return call(name)
    except StoreBusy:
        return None
