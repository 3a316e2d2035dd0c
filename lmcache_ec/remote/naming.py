"""Where an entry lives in each remote store, and what a remote URL names.

One naming, used by every store (``redis_store``, ``s3_store``) and so by
both the serving path and ``RemoteCatalog``:

- Redis (standalone, Cluster, Sentinel): two keys per entry, as LMCache's own
  ``RedisConnector`` writes them: ``<storage_name>kv_bytes`` (the frame) and
  ``<storage_name>metadata`` (LMCache's ``RemoteMetadata``: length, shape,
  dtype, format). The frame is the entry: existence checks look at it.
- S3: one object per entry, ``<prefix>/<storage_name>``, holding the frame;
  its size is the frame length.
- A claim (an encode in flight, ``claims.py``) for an entry lives beside it,
  never at its key: ``<storage_name>.claim`` (Redis key, S3 object). It is
  not a storage name, so listings and purges never see it.

Pure string handling: no client library is imported here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlparse

REDIS_DATA_SUFFIX = "kv_bytes"
REDIS_META_SUFFIX = "metadata"
S3_SCHEME = "s3"


def redis_data_key(storage_name: str) -> str:
    return storage_name + REDIS_DATA_SUFFIX


def redis_meta_key(storage_name: str) -> str:
    return storage_name + REDIS_META_SUFFIX


CLAIM_SUFFIX = ".claim"


def claim_key(name: str) -> str:
    """Where the claim on ``name`` lives: beside the entry, never at its key."""
    return name + CLAIM_SUFFIX


def scheme_of(url: str | None) -> str:
    return urlparse(url).scheme.lower() if url else ""


def redact(url: str | None) -> str:
    """``url`` with any password replaced by ``***``."""
    if not url or "@" not in url:
        return url or ""
    head, _, tail = url.rpartition("@")
    scheme, sep, auth = head.partition("://")
    user = auth.split(":", 1)[0] if ":" in auth else auth
    return f"{scheme}{sep}{user}:***@{tail}" if ":" in auth else url


_URL_CREDENTIALS = re.compile(r"(\b[a-z][a-z0-9+.-]*://)([^/@\s:]*):([^/@\s]*)@", re.IGNORECASE)


def redact_text(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` replaced by ``***``."""
    return _URL_CREDENTIALS.sub(r"\1\2:***@", text)


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/prefix``: the bucket and the key prefix (no slashes at the ends)."""

    bucket: str
    prefix: str = ""

    def object_key(self, storage_name: str) -> str:
        return f"{self.prefix}/{storage_name}" if self.prefix else storage_name

    def storage_name(self, object_key: str) -> str | None:
        """The storage name of an object key under this prefix, else None."""
        head = f"{self.prefix}/" if self.prefix else ""
        if not object_key.startswith(head):
            return None
        name = object_key[len(head) :]
        return name if name and "/" not in name else None


def parse_s3_url(url: str) -> S3Location:
    """``s3://bucket[/prefix]`` -> ``S3Location``; ``ValueError`` if malformed."""
    parsed = urlparse(url)
    if parsed.scheme.lower() != S3_SCHEME:
        raise ValueError(f"not an s3:// URL: {url!r}")
    bucket = parsed.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise ValueError(
            "expected s3://bucket/prefix (put the endpoint in s3_endpoint_url "
            "and credentials in the AWS environment or config files)"
        )
    if parsed.query or parsed.fragment:
        raise ValueError("s3:// URLs take no query or fragment; use the s3_* options")
    return S3Location(bucket=bucket, prefix=parsed.path.strip("/"))


@dataclass(frozen=True)
class NodeList:
    """``scheme://[user[:password]@]host1:port1[,host2:port2…][/service]``.

    LMCache's spelling of Redis Cluster (``redis-cluster://``) and Sentinel
    (``redis-sentinel://…/service_name``) URLs.
    """

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    service: str = ""  # Sentinel: the monitored master's name


def parse_node_list(url: str, *, service: bool) -> NodeList:
    """Parse a node-list URL; ``service``: the path names a Sentinel master.

    ``ValueError`` naming what is wrong if malformed.
    """
    _, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a URL: {url!r}")
    auth, _, location = rest.rpartition("@")
    hosts, _, path = location.partition("/")
    username, password = None, None
    if auth:
        user, has_password, secret = auth.partition(":")
        username, password = user or None, secret if has_password else None
    nodes: list[tuple[str, int]] = []
    for part in hosts.split(","):
        parsed = urlparse(f"//{part.strip()}")
        try:
            port = parsed.port
        except ValueError as exc:
            raise ValueError(f"node {part!r}: {exc}") from None
        if not parsed.hostname or port is None:
            raise ValueError(f"node {part!r} must be host:port")
        nodes.append((parsed.hostname, port))
    name = path.strip("/")
    if "?" in location or "#" in location:
        raise ValueError("node-list URLs take no query or fragment")
    if service and not name:
        raise ValueError("expected …/service_name after the sentinel nodes")
    if not service and name:
        raise ValueError("a cluster URL names nodes only (no /path)")
    return NodeList(tuple(nodes), username, password, name)
