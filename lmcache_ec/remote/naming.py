"""Where an entry lives in each remote store, given its storage name.

One naming, shared by the LMCache connectors (writers and readers on the
serving path) and by ``RemoteCatalog`` (listing, existence, purge):

- Redis (LMCache's own ``RedisConnector``): two keys per entry,
  ``<storage_name>kv_bytes`` (the frame) and ``<storage_name>metadata``
  (LMCache's ``RemoteMetadata``: length, shape, dtype, format). The metadata
  key is written last and is the one existence checks look at.
- S3 (``ECS3Connector``): one object per entry, ``<prefix>/<storage_name>``,
  holding the frame; its size is the frame length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlparse

REDIS_DATA_SUFFIX = "kv_bytes"
REDIS_META_SUFFIX = "metadata"
REDIS_SCHEMES = ("redis", "rediss", "unix")
S3_SCHEME = "s3"

S3_PLUGIN = "ec_s3"  # name in LMCache's remote_storage_plugins
S3_PLUGIN_KEY = f"remote_storage_plugin.{S3_PLUGIN}."  # extra_config key prefix
TIMEOUT_KEY = "ec.remote_timeout"  # extra_config keys read by ECRemoteBackend
RETRY_INTERVAL_KEY = "ec.remote_retry_interval"


def redis_data_key(storage_name: str) -> str:
    return storage_name + REDIS_DATA_SUFFIX


def redis_meta_key(storage_name: str) -> str:
    return storage_name + REDIS_META_SUFFIX


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
