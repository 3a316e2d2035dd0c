"""Remote tier: ``ECCache`` over Redis or S3 vs the raw client, same bytes, same run.

``ECCache`` runs with ``local_cpu: false`` and no disk tier, so its CPU pool
only stages transfers and every ``get`` is answered by the remote store
(each row reports its hits by tier; a miss would show). The baseline is the
client library alone, moving the very bytes ``ECCache`` stored (the frame):

- ``get``: ``ECCache.get`` (lookup, transfer, checksum, decode, copy out) vs
  redis-py ``GET`` / boto3 ``get_object`` + ``read()`` of the same key.
- ``put (stored)``: ``ECCache.put`` + ``flush()`` of a new entry, i.e. until
  the remote store has it (existence check, upload) vs redis-py ``SET`` /
  boto3 ``put_object`` of the same bytes under a new key.
- ``put (returns)``: time for ``ECCache.put`` to return; the upload runs in
  the background. No baseline: a raw client has no asynchronous put.

Measurements alternate between ``ECCache`` and the baseline in one loop, so
both see the same machine load. Entries go to a fresh namespace that is
deleted afterwards.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch

from ..key import SUPPORTED_DTYPES
from . import result_row

OURS = "lmcache-ec"
RAW = {"redis": "redis-py", "s3": "boto3"}


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


class _RawRedis:
    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.names = ("GET", "SET")

    def get(self, storage_name: str) -> bytes:
        return self.client.get(storage_name + "kv_bytes")

    def put(self, key: str, data: bytes) -> None:
        self.client.set(key, data)

    def cleanup(self, keys: list[str]) -> None:
        if keys:
            self.client.delete(*keys)


class _RawS3:
    def __init__(self, url: str, endpoint_url: str | None, region: str | None) -> None:
        import boto3

        from ..remote.naming import parse_s3_url

        self.location = parse_s3_url(url)
        self.client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
        self.names = ("get_object", "put_object")

    def get(self, storage_name: str) -> bytes:
        key = self.location.object_key(storage_name)
        response = self.client.get_object(Bucket=self.location.bucket, Key=key)
        with response["Body"] as body:
            return body.read()

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(
            Bucket=self.location.bucket, Key=self.location.object_key(key), Body=data
        )

    def cleanup(self, keys: list[str]) -> None:
        for key in keys:
            self.client.delete_object(
                Bucket=self.location.bucket, Key=self.location.object_key(key)
            )


def run_remote_bench(
    kind: str,
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    shape: tuple[int, int] = (256, 2560),
    dtype: str = "bfloat16",
    iterations: int = 50,
    warmup: int = 5,
    threads: int = 1,
) -> list[dict[str, Any]]:
    """Median/p99 ms per op of ``ECCache`` on one remote store next to its raw client.

    ``kind`` is ``"redis"`` (``url`` = ``redis://…``/``rediss://…``) or ``"s3"``
    (``url`` = ``s3://bucket/prefix``, ``endpoint_url`` for S3-compatible
    stores; credentials from the AWS environment). Returns rows with
    ``tier, op, engine, shape, dtype, n, median_ms, p99_ms`` plus ``hits``
    (ECCache get rows) and ``ratio`` (ECCache median / raw median).
    """
    from ..engine import ECCache
    from ..remote.catalog import open_catalog

    if kind not in RAW:
        raise ValueError(f"kind must be one of {sorted(RAW)}")
    torch.set_num_threads(threads)
    torch_dtype = SUPPORTED_DTYPES[dtype]
    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    config: dict[str, Any] = {
        "local_cpu": False,  # the pool only stages: every get is a remote read
        "max_local_cpu_size": 0.25,
        "remote_url": url,
        "remote_timeout": 30.0,
        "namespace": namespace,
    }
    if kind == "s3":
        config.update(s3_endpoint_url=endpoint_url, s3_region=region)
    raw: _RawRedis | _RawS3 = (
        _RawRedis(url) if kind == "redis" else _RawS3(url, endpoint_url, region)
    )
    raw_keys: list[str] = []
    total = warmup + iterations
    tensors = [torch.randn(*shape).to(torch_dtype) for _ in range(min(total, 8))]
    times: dict[str, list[float]] = {k: [] for k in ("get", "raw_get", "put", "stored", "raw_put")}
    hits_before: dict[str, int] = {}

    with ECCache.from_config(config, model="bench/remote") as cache:
        if cache.tiers[-1] != "remote":
            raise RuntimeError(f"no remote tier in {cache.tiers}")
        for i in range(total):
            tensor = tensors[i % len(tensors)]
            mm_hash = f"img-{i}"
            ok, t_put = _timed(lambda: cache.put(mm_hash, tensor))  # noqa: B023
            stored, t_flush = _timed(lambda: cache.flush(60))
            if not (ok and stored):
                raise RuntimeError("the remote store did not take the entry")
            name = cache.key(mm_hash).storage_name
            data = raw.get(name)
            raw_key = f"{namespace}-raw-{i}"
            raw_keys.append(raw_key)
            _, t_raw_put = _timed(lambda: raw.put(raw_key, data))  # noqa: B023
            if i == warmup:
                hits_before = dict(cache.stats.snapshot()["hits"])
            out, t_get = _timed(lambda: cache.get(mm_hash))  # noqa: B023
            if out is None or not torch.equal(out, tensor):
                raise RuntimeError("remote read returned a wrong tensor or missed")
            _, t_raw_get = _timed(lambda: raw.get(name))  # noqa: B023
            if i >= warmup:
                for label, value in (
                    ("put", t_put),
                    ("stored", t_put + t_flush),
                    ("raw_put", t_raw_put),
                    ("get", t_get),
                    ("raw_get", t_raw_get),
                ):
                    times[label].append(value)
        hits_after = cache.stats.snapshot()["hits"]
        catalog = open_catalog(cache.config)
        assert catalog is not None
        with catalog:
            for name, _size in list(catalog.list(cache.identity.storage_prefix)):
                catalog.delete(name)
    raw.cleanup(raw_keys)

    hits = {
        t: n - hits_before.get(t, 0) for t, n in hits_after.items() if n - hits_before.get(t, 0)
    }
    frame_bytes = len(data)
    get_name, put_name = (f"{RAW[kind]} {n}" for n in raw.names)

    def ratio(ours: str, base: str) -> float:
        return statistics.median(times[ours]) / statistics.median(times[base])

    common = {"frame_bytes": frame_bytes}
    return [
        result_row(
            kind,
            "get",
            OURS,
            shape,
            dtype,
            times["get"],
            hits=hits,
            ratio=ratio("get", "raw_get"),
            **common,
        ),
        result_row(kind, "get", get_name, shape, dtype, times["raw_get"], **common),
        result_row(
            kind,
            "put (stored)",
            OURS,
            shape,
            dtype,
            times["stored"],
            ratio=ratio("stored", "raw_put"),
            **common,
        ),
        result_row(kind, "put (stored)", put_name, shape, dtype, times["raw_put"], **common),
        result_row(
            kind,
            "put (returns)",
            OURS,
            shape,
            dtype,
            times["put"],
            note="upload continues in the background",
            **common,
        ),
    ]
