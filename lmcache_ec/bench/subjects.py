"""What the benchmark measures: lmcache-ec, its baselines and the physical limits.

- ``open_ours``: ``ECCache`` on a tier config.
- ``open_upstream``: LMCache 0.5.6 ``ECCacheEngine`` on the same config
  (its private parts are reached through ``private_access`` only).
- ``ExampleConnector``: vLLM's ``ECExampleConnector`` (one safetensors file
  per item), driven through its worker API (``save_caches``,
  ``start_load_caches`` with bound metadata).
- ``RawFile``, ``RawRedis``, ``RawS3``: the same bytes moved by the OS or
  the bare client (redis-py, boto3): the limit a tier could reach.

``ECCache`` is driven through public calls only: ``cold_cpu`` empties its
CPU tier by reopening it on the same tiers.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import torch
import xxhash

from .measure import wait_until

MODEL = "bench/model"
# Shipped with the package: a BLIP-2 config and processor, no weights. vLLM
# needs a model directory to build the config its connectors are made from.
TINY_MODEL_DIR = str(resources.files("lmcache_ec.bench") / "tiny_model")
# These harnesses drive the connector without loading a model, so no worker
# announces an encoder-weights fingerprint: keys use ec.weights_version alone.
NO_MODEL = {"weights_fingerprint": False}


def open_ours(config: dict[str, Any], dtype: torch.dtype, namespace: str | None = None) -> Any:
    from ..engine import ECCache

    return ECCache.from_config(config, model=MODEL, dtype=dtype, namespace=namespace)


def batch_note(ours: Any) -> str:
    """How a ``get_many`` of ``ours`` reads (a row's footnote)."""
    return f"{ours.config.read_threads} read threads below the CPU tier"


def open_upstream(config: dict[str, Any], dtype: torch.dtype) -> Any:
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.ec_engine import ECCacheEngine

    from .private_access import upstream_metadata

    return ECCacheEngine(
        LMCacheEngineConfig.from_defaults(**config), upstream_metadata(MODEL), dtype
    )


def close_bounded(engine: Any, timeout: float = 5.0) -> bool:
    """Close ``engine`` without waiting more than ``timeout``.

    LMCache 0.5.6's ``close()`` never returns once a remote backend is
    configured (its connector blocks the event loop it waits on); such an
    engine is left behind, and the worker process exits with ``os._exit``.
    """
    closer = threading.Thread(target=engine.close, name="bench-close", daemon=True)
    closer.start()
    closer.join(timeout)
    return not closer.is_alive()


def cold_cpu(ours: Any) -> Any:
    """``ours`` closed and opened again on the same tiers: its CPU tier starts
    empty, so the next reads come from below (public calls only)."""
    from ..engine import ECCache

    ours.close()
    return ECCache(ours.config, ours.identity)


def disk_path(ours: Any, mm_hash: str) -> str:
    """The file the disk tier keeps ``mm_hash`` in (named by the disk layout)."""
    from ..tiers.disk_layout import entry_file

    return os.path.join(ours.config.local_disk, entry_file(ours.key(mm_hash).storage_name))


def timed_put(cache: Any, mm_hash: str, tensor: torch.Tensor) -> tuple[float, float, bool]:
    """(seconds until ``put`` returned, seconds until every tier had it, write still running
    when ``put`` returned)."""
    started = time.perf_counter()
    if not cache.put(mm_hash, tensor):
        raise RuntimeError("ECCache refused a put (CPU pool full)")
    returned = time.perf_counter()
    in_flight = cache.pending_writes() > 0
    if not wait_until(lambda: cache.pending_writes() == 0):
        raise RuntimeError("a write below the CPU tier did not finish within 120 s")
    return returned - started, time.perf_counter() - started, in_flight


class PutTimes:
    """Seconds of interleaved puts, one list per column, and how many of ours still
    had a write running when ``put`` returned (``result()``: columns + ``in_flight``)."""

    def __init__(self, *columns: str) -> None:
        self.times: dict[str, list[float]] = {
            k: [] for k in ("ours_returns", "ours_stored", "cpu_only", "up_returns", "up_stored")
        }
        self.times.update({k: [] for k in columns})
        self.in_flight = 0

    def ours(self, cache: Any, mm_hash: str, tensor: torch.Tensor) -> None:
        returns, stored, running = timed_put(cache, mm_hash, tensor)
        self.times["ours_returns"].append(returns)
        self.times["ours_stored"].append(stored)
        self.in_flight += running

    def upstream(
        self, engine: Any, mm_hash: str, tensor: torch.Tensor, stored: Callable[[], Any]
    ) -> None:
        """``engine.put``, then ``stored()`` waits for its write to land."""
        started = time.perf_counter()
        engine.put(mm_hash, tensor)
        returned = time.perf_counter()
        stored()
        self.times["up_returns"].append(returned - started)
        self.times["up_stored"].append(time.perf_counter() - started)

    def timed(self, column: str, call: Callable[[], Any]) -> None:
        started = time.perf_counter()
        call()
        self.times[column].append(time.perf_counter() - started)

    def result(self) -> dict[str, Any]:
        return {**self.times, "in_flight": self.in_flight}


def warm_pool(cache: Any, tensor: torch.Tensor, count: int) -> None:
    """Put and remove ``count`` entries: later puts reuse pool memory touched once
    (upstream zero-fills its pool at start; the cold case has its own CPU-tier row)."""
    names = [f"warm-pool-{i}" for i in range(count)]
    for name in names:
        cache.put(name, tensor)
    cache.flush(120)
    for name in names:
        cache.remove(name)


def same(a: Any, b: torch.Tensor) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    )


class ExampleConnector:
    """vLLM's ``ECExampleConnector`` (worker role, ``ec_both``) on ``directory``."""

    label = "ECExampleConnector"

    def __init__(self, directory: str, model_dir: str = TINY_MODEL_DIR) -> None:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
        from vllm.distributed.ec_transfer.ec_connector.example_connector import (
            ECExampleConnector,
            ECExampleConnectorMetadata,
            MMMeta,
        )

        self._metadata = ECExampleConnectorMetadata
        self._item = MMMeta
        config = vllm_config(model_dir, "ECExampleConnector", {"shared_storage_path": directory})
        self.connector = ECExampleConnector(config, ECConnectorRole.WORKER)

    def save(self, mm_hash: str, tensor: torch.Tensor) -> None:
        self.connector.save_caches({mm_hash: tensor}, mm_hash)

    def load(self, mm_hashes: list[str], tokens: int) -> dict[str, torch.Tensor]:
        """What a worker step does: bind the scheduler's metadata, then load."""
        meta = self._metadata()
        for mm_hash in mm_hashes:
            meta.add_mm_data(self._item.make_meta(mm_hash, tokens))
        encoder_cache: dict[str, torch.Tensor] = {}
        self.connector.bind_connector_metadata(meta)
        try:
            self.connector.start_load_caches(encoder_cache)
        finally:
            self.connector.clear_connector_metadata()
        return encoder_cache


def vllm_config(model_dir: str, connector: str, extra: dict[str, Any]) -> Any:
    from vllm.config import ECTransferConfig, ModelConfig, VllmConfig

    model = ModelConfig(model=model_dir, tokenizer=model_dir, max_model_len=256, dtype="bfloat16")
    return VllmConfig(
        model_config=model,
        ec_transfer_config=ECTransferConfig(
            ec_connector=connector, ec_role="ec_both", ec_connector_extra_config=extra
        ),
    )


class RawFile:
    """Plain file I/O of the same bytes: the page-cache limit of the disk tier."""

    label_read = "readinto (page cache)"
    label_verified = "readinto + xxh3"
    label_write = "write + close"

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)

    def write(self, name: str, data: memoryview | bytes) -> None:
        with open(os.path.join(self.directory, name), "wb") as stream:
            stream.write(data)

    @staticmethod
    def read(path: str) -> torch.Tensor:
        buffer = torch.empty(os.path.getsize(path), dtype=torch.uint8)
        with open(path, "rb", buffering=0) as stream:
            stream.readinto(buffer.numpy())  # type: ignore[attr-defined]
        return buffer

    @staticmethod
    def read_verified(path: str) -> torch.Tensor:
        """``read`` and one checksum over the bytes: the least a read that
        verifies what it returns must do."""
        buffer = RawFile.read(path)
        xxhash.xxh3_64_intdigest(buffer.numpy())
        return buffer


def read_once(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """One pass over a result's bytes, as its consumer's copy would make: a
    tensor over a file mapping brings its pages in here, a copied one is
    already resident."""
    if tensor is not None:
        xxhash.xxh3_64_intdigest(tensor.view(torch.uint8).numpy())
    return tensor


class RawRedis:
    """redis-py alone; the same parser (hiredis when installed) ECCache's connector uses."""

    label_read = "redis-py GET"
    label_write = "redis-py SET"

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.written: list[str] = []

    def read(self, storage_name: str) -> bytes:
        return self.client.get(storage_name + "kv_bytes")

    def write(self, name: str, data: bytes) -> None:
        self.client.set(name, data)
        self.written.append(name)

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            for start in range(0, len(self.written), 100):
                self.client.delete(*self.written[start : start + 100])
        self.written.clear()


class RawS3:
    """boto3 alone: ``get_object`` + ``read()``, ``put_object``."""

    label_read = "boto3 get_object"
    label_write = "boto3 put_object"

    def __init__(self, url: str, endpoint_url: str | None, region: str | None) -> None:
        import boto3

        from ..remote_names import parse_s3_url

        self.location = parse_s3_url(url)
        self.client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
        self.written: list[str] = []

    def read(self, storage_name: str) -> bytes:
        key = self.location.object_key(storage_name)
        response = self.client.get_object(Bucket=self.location.bucket, Key=key)
        with response["Body"] as body:
            return body.read()

    def write(self, name: str, data: bytes) -> None:
        key = self.location.object_key(name)
        self.client.put_object(Bucket=self.location.bucket, Key=key, Body=data)
        self.written.append(key)

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            for key in self.written:
                self.client.delete_object(Bucket=self.location.bucket, Key=key)
        self.written.clear()
