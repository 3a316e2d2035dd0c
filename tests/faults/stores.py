"""Raw access to what each tier stores, for planting damaged or foreign entries.

Goes around the cache on purpose: the disk tier's file, Redis's frame key,
S3's object, read and written as bytes. ``craft_frame`` builds a frame whose
checksums are valid but whose header says what the test wants (a wrong shape,
a wrong dtype, another key).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lmcache_ec import codec
from lmcache_ec.key import ECKey
from lmcache_ec.remote_names import parse_s3_url, redis_data_key, scheme_of


def craft_frame(key: ECKey, tensor: torch.Tensor, **header_changes: Any) -> bytes:
    """A checksummed frame of ``tensor`` under ``key`` with header fields replaced."""
    header = json.loads(codec.encode_header(key, tensor))
    header.update(header_changes)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % codec.ALIGN)
    buffer = torch.zeros(codec.frame_size(raw, tensor), dtype=torch.uint8)
    codec.write_frame(buffer, raw, tensor)
    return buffer.numpy().tobytes()


def disk_path(disk_dir: Path, key: ECKey) -> Path:
    return disk_dir / f"{key.storage_name}.pt"


class RawRemote:
    """The frame bytes a Redis or S3 remote holds, by storage name."""

    def __init__(self, url: str, endpoint: str | None = None) -> None:
        self.kind = "s3" if scheme_of(url) == "s3" else "redis"
        if self.kind == "redis":
            import redis

            self._redis = redis.Redis.from_url(url, socket_timeout=5)
        else:
            import boto3

            self._location = parse_s3_url(url)
            self._s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

    def _object(self, name: str) -> dict[str, str]:
        return {"Bucket": self._location.bucket, "Key": self._location.object_key(name)}

    def get(self, name: str) -> bytes | None:
        if self.kind == "redis":
            return self._redis.get(redis_data_key(name))
        try:
            return self._s3.get_object(**self._object(name))["Body"].read()
        except self._s3.exceptions.NoSuchKey:
            return None

    def set(self, name: str, data: bytes) -> None:
        if self.kind == "redis":
            self._redis.set(redis_data_key(name), data)
        else:
            self._s3.put_object(Body=data, **self._object(name))

    def stored_keys(self) -> list[str]:
        """Every key (Redis) or object key (S3) in the store, as stored."""
        if self.kind == "redis":
            return [k.decode() for k in self._redis.scan_iter(count=1000)]
        pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=self._location.bucket)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def close(self) -> None:
        if self.kind == "redis":
            self._redis.close()
        else:
            self._s3.close()
