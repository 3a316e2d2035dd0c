"""LMCache internals lmcache-ec relies on, pinned: a failure names the upstream change.

One test per internal (attribute, signature or behaviour). Each says what
uses it and why LMCache's public interface (``StorageBackendInterface``,
``AllocatorBackendInterface``, ``MemoryObj``) does not suffice; the list is
docs/architecture.md, "Upstream internals".
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections import OrderedDict

import pytest
import torch
from lmcache.utils import CacheEngineKey, DiskCacheMetadata
from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.storage_backend.cache_policy.lru import LRUCachePolicy
from lmcache.v1.storage_backend.connector import InstrumentedRemoteConnector
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend, LocalDiskWorker
from lmcache.v1.storage_backend.remote_backend import RemoteBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager

from lmcache_ec import ECCache
from lmcache_ec.key import ECKey, EncoderIdentity
from lmcache_ec.tiers.allocator import HostPoolAllocator

MODEL = "org/upstream-contract"


def _params(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def _says(what: str, where: str, why: str) -> str:
    return f"LMCache renamed/removed {what}; {where} relies on it for {why}"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.01,
        "local_disk": str(tmp_path_factory.mktemp("disk")),
        "max_local_disk_size": 0.01,
    }
    with ECCache.from_config(config, model=MODEL) as cache:
        yield cache


# -- the CPU pool (tiers/allocator.py) ------------------------------------------


def test_mixed_allocator_builds_an_empty_arena_and_allocates_from_pin_allocator():
    """HostPoolAllocator runs MixedMemoryAllocator.__init__ with size 0 (no arena
    allocated or zero-filled) and swaps in its own lazily touched arena as
    ``buffer``/``size``/``pin_allocator``: upstream offers no lazily touched pool,
    and LocalCPUBackend asserts the MixedMemoryAllocator type before evicting."""
    assert _params(MixedMemoryAllocator.__init__)[:2] == ["self", "size"], _says(
        "MixedMemoryAllocator(size)", "tiers/allocator.py", "building the pool allocator"
    )
    pool = HostPoolAllocator(1 << 20)
    assert isinstance(pool.pin_allocator, TensorMemoryAllocator)
    obj = pool.allocate(torch.Size([1000]), torch.uint8, MemoryFormat.EC_TD)
    assert obj is not None, _says(
        "MixedMemoryAllocator.allocate via pin_allocator", "tiers/allocator.py", "the CPU pool"
    )
    start = pool.buffer.data_ptr()
    assert start <= obj.raw_tensor.data_ptr() < start + pool.size, _says(
        "MixedMemoryAllocator.buffer/pin_allocator",
        "tiers/allocator.py",
        "allocating from its own arena",
    )
    obj.ref_count_down()


def test_tensor_allocator_counts_allocated_bytes():
    """``ECLocalCPUBackend.used_bytes`` (stats) reads
    ``TensorMemoryAllocator.total_allocated_size``: no public usage counter."""
    pool = HostPoolAllocator(1 << 20)
    before = pool.used_bytes()
    obj = pool.allocate(torch.Size([5000]), torch.uint8, MemoryFormat.EC_TD)
    assert pool.used_bytes() >= before + 5000, _says(
        "TensorMemoryAllocator.total_allocated_size", "tiers/allocator.py", "used_bytes"
    )
    obj.ref_count_down()


# -- the CPU tier (tiers/local_cpu.py) --------------------------------------------


def test_local_cpu_backend_builds_its_allocator_through_initialize_allocator(cache):
    """ECLocalCPUBackend overrides ``initialize_allocator(config, metadata)``, which
    LocalCPUBackend.__init__ calls: the only way to give it another pool."""
    assert _params(LocalCPUBackend.initialize_allocator)[:3] == ["self", "config", "metadata"]
    assert isinstance(cache._cpu.memory_allocator, HostPoolAllocator), _says(
        "LocalCPUBackend.initialize_allocator/memory_allocator",
        "tiers/local_cpu.py",
        "a lazily touched pool",
    )


def test_local_cpu_backend_keeps_entries_in_hot_cache_under_cpu_lock(cache):
    """ECLocalCPUBackend.get_blocking moves a hit to the end of ``hot_cache``
    under ``cpu_lock`` (upstream's hits leave the order FIFO); ``entries`` and
    purges list it; ``use_hot`` says whether the tier holds entries at all."""
    cpu = cache._cpu
    assert isinstance(cpu.hot_cache, OrderedDict), _says(
        "LocalCPUBackend.hot_cache (an OrderedDict)", "tiers/local_cpu.py", "LRU on hits"
    )
    assert hasattr(cpu.cpu_lock, "acquire"), _says(
        "LocalCPUBackend.cpu_lock", "tiers/local_cpu.py", "reading hot_cache safely"
    )
    assert cpu.use_hot is True, _says(
        "LocalCPUBackend.use_hot", "tiers/local_cpu.py", "knowing local_cpu is on"
    )
    cache.put("pinned", torch.ones(2, 8))
    key = cache.key("pinned")
    assert key in cpu.hot_cache, _says(
        "LocalCPUBackend.hot_cache keyed by CacheEngineKey", "tiers/local_cpu.py", "hits"
    )


def test_lru_policy_update_on_hit_is_move_to_end():
    """ECLocalCPUBackend and the disk tier do what ``LRUCachePolicy.update_on_hit``
    does (``move_to_end``) without its per-hit statistics; they must stay equal."""
    policy = LRUCachePolicy()
    cache: OrderedDict = OrderedDict((k, None) for k in "abc")
    policy.update_on_hit("a", cache)
    assert list(cache) == ["b", "c", "a"], _says(
        "LRUCachePolicy.update_on_hit as move_to_end",
        "tiers/local_cpu.py, tiers/local_disk.py",
        "their inlined LRU update",
    )
    evict = _params(LRUCachePolicy.get_evict_candidates)
    assert evict[:3] == ["self", "cache_dict", "num_candidates"]


def test_local_cpu_backend_allocate_and_put_signatures():
    """Frames are allocated with ``allocate(shape, dtype, fmt, eviction=, busy_loop=)``
    and put with ``submit_put_task(key, memory_obj, ...)`` (overridden to stamp use
    order); victims go through ``batched_remove(keys, force=)``."""
    assert _params(LocalCPUBackend.allocate) == [
        "self",
        "shapes",
        "dtypes",
        "fmt",
        "eviction",
        "busy_loop",
    ], _says("LocalCPUBackend.allocate's keywords", "tiers/local_cpu.py", "frame buffers")
    assert _params(LocalCPUBackend.submit_put_task)[:3] == ["self", "key", "memory_obj"]
    assert _params(LocalCPUBackend.batched_remove)[:3] == ["self", "keys", "force"]
    assert MemoryFormat.EC_TD.name == "EC_TD"


# -- the disk tier (tiers/local_disk.py) -------------------------------------------


def test_local_disk_backend_index_and_locks(cache):
    """ECLocalDiskBackend rebuilds, adopts and evicts entries in upstream's index
    (``dict`` of ``DiskCacheMetadata`` under ``disk_lock``, sizes in
    ``current_cache_size``/``usage``/``max_cache_size``): upstream keeps no index
    across restarts and offers no hook to fill it."""
    disk = cache._disk
    for name in ("dict", "disk_lock", "current_cache_size", "usage", "max_cache_size", "path"):
        assert hasattr(disk, name), _says(
            f"LocalDiskBackend.{name}", "tiers/local_disk.py", "its persistent index"
        )
    assert isinstance(disk.dict, OrderedDict)
    fields = ["path", "size", "shape", "dtype", "cached_positions", "fmt", "pin_count"]
    meta = DiskCacheMetadata("p", 1, torch.Size([1]), torch.uint8, None, MemoryFormat.EC_TD, 0)
    assert [getattr(meta, f) for f in fields[:2]] == ["p", 1], _says(
        "DiskCacheMetadata's positional fields", "tiers/local_disk.py", "index entries"
    )
    assert _params(LocalDiskBackend.insert_key)[:6] == [
        "self",
        "key",
        "size",
        "shape",
        "dtype",
        "fmt",
    ]


def test_local_disk_backend_paths_are_storage_names(cache):
    """Files are found again by name: ``_key_to_path`` must stay
    ``<dir>/<key.to_string()>.pt`` (disk scans, inventory and purges rely on it)."""
    key = ECKey.from_storage_name(cache.key("x").storage_name)
    path = cache._disk._key_to_path(key)
    assert path.endswith("/" + key.storage_name + ".pt"), _says(
        "LocalDiskBackend._key_to_path's naming", "tiers/local_disk.py", "finding entries"
    )


def test_local_disk_worker_put_tasks():
    """Writes in flight are tracked in upstream's ``disk_worker``
    (``try_insert_put_task``/``remove_put_task``, ``put_tasks`` under
    ``put_lock``): ``pending_writes`` and admission read them."""
    for name in ("try_insert_put_task", "remove_put_task"):
        assert callable(getattr(LocalDiskWorker, name, None)), _says(
            f"LocalDiskWorker.{name}", "tiers/local_disk.py", "writes in flight"
        )
    worker = LocalDiskWorker.__new__(LocalDiskWorker)
    worker.put_lock = threading.Lock()
    worker.put_tasks = []
    assert worker.try_insert_put_task("k") and worker.put_tasks == ["k"]
    worker.remove_put_task("k")
    assert worker.put_tasks == []


# -- the storage manager (tiers/manager.py, engine.py) -----------------------------


def test_storage_manager_builds_backends_through_create_backends(cache):
    """ECStorageManager overrides ``create_backends`` (called by
    StorageManager.__init__) to build our tiers first; upstream then skips names
    already in ``storage_backends``. It uses ``manager_lock``, ``loop`` and
    ``thread`` (stopped when a tier fails to build; the loop's default executor
    is shut down on close, which upstream leaves running)."""
    storage = cache._storage
    assert isinstance(storage, StorageManager)
    assert _params(StorageManager.__init__)[:4] == ["self", "config", "metadata", "event_manager"]
    for name in ("storage_backends", "manager_lock", "loop", "thread", "config", "metadata"):
        assert hasattr(storage, name), _says(
            f"StorageManager.{name}", "tiers/manager.py", "building and closing tiers"
        )
    assert isinstance(storage.loop, asyncio.AbstractEventLoop)
    assert list(storage.storage_backends)[:2] == ["LocalCPUBackend", "LocalDiskBackend"], _says(
        "StorageManager.storage_backends' names", "tiers/manager.py", "the tier order"
    )
    names = [name for name, _ in storage.get_active_storage_backends()]
    assert names == list(storage.storage_backends), _says(
        "StorageManager.get_active_storage_backends", "tiers/manager.py", "tiers()"
    )


# -- keys (key.py) ---------------------------------------------------------------


def test_cache_engine_key_constructor():
    """ECKey subclasses CacheEngineKey (StorageManager and every backend take one)
    and calls its constructor with these keywords."""
    assert _params(CacheEngineKey.__init__)[:6] == [
        "self",
        "model_name",
        "world_size",
        "worker_id",
        "chunk_hash",
        "dtype",
    ], _says("CacheEngineKey's constructor", "key.py", "ECKey")
    key = EncoderIdentity(model=MODEL).key("h")
    assert isinstance(key, CacheEngineKey) and key.to_string() == key.storage_name


# -- remote (remote/backend.py, remote/*_connector.py) ------------------------------


def test_remote_backend_and_connector_bases():
    """ECRemoteBackend subclasses RemoteBackend (its constructor builds connectors
    from ``CreateConnector`` and plugins); our connectors subclass RemoteConnector;
    InstrumentedRemoteConnector wraps them (``getWrappedConnector``)."""
    assert _params(RemoteBackend.__init__) == [
        "self",
        "config",
        "metadata",
        "loop",
        "local_cpu_backend",
        "dst_device",
        "plugin_name",
    ], _says("RemoteBackend's constructor", "remote/backend.py", "remote tiers")
    for name in ("get", "put", "exists", "close", "list"):
        assert callable(getattr(RemoteConnector, name, None)), _says(
            f"RemoteConnector.{name}", "remote/*_connector.py", "our connectors"
        )
    assert callable(getattr(InstrumentedRemoteConnector, "getWrappedConnector", None)), _says(
        "InstrumentedRemoteConnector.getWrappedConnector", "remote/backend.py", "blocking reads"
    )
