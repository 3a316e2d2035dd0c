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
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.cache_policy.lru import LRUCachePolicy
from lmcache.v1.storage_backend.connector import InstrumentedRemoteConnector
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.remote_backend import RemoteBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager

from lmcache_ec import ECCache
from lmcache_ec.key import EncoderIdentity
from lmcache_ec.tiers.allocator import HostPoolAllocator
from lmcache_ec.tiers.frame_directory import FrameDirectoryTier

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


def test_the_encoder_tier_calls_none_of_lmcaches_device_ops(monkeypatch, tmp_path, make_cache):
    """LMCache binds its compiled ``cuda_ops`` into ``lmcache.device_ops`` when the
    extension loads for the installed torch, and keeps torch fallbacks otherwise
    (lmcache 0.5.6 under torch 2.14). The encoder tier's pool, puts and reads use
    torch alone, so that difference cannot reach them: every op is counted here."""
    import lmcache

    calls: list[str] = []
    for name in dir(lmcache.device_ops):
        op = getattr(lmcache.device_ops, name, None)
        if name.startswith("_") or isinstance(op, type) or not callable(op):
            continue

        def counted(*args, _name=name, _op=op, **kwargs):
            calls.append(_name)
            return _op(*args, **kwargs)

        monkeypatch.setattr(lmcache.device_ops, name, counted)
    config = {
        "max_local_cpu_size": 0.01,
        "local_disk": str(tmp_path),
        "max_local_disk_size": 0.01,
    }
    tensor = torch.randn(16, 32).to(torch.bfloat16)
    with make_cache(config, model=MODEL) as cache:
        cache.put("device-ops", tensor)
        assert torch.equal(cache.get("device-ops"), tensor)
        assert cache.flush(10)
    with make_cache(config, model=MODEL) as cache:  # a fresh process: disk
        assert torch.equal(cache.get_many(["device-ops"])[0], tensor)
    HostPoolAllocator(1 << 20).close()
    assert calls == [], f"the encoder tier now calls LMCache's device ops {sorted(set(calls))}"


def test_thread_safe_takes_the_shared_lock_from_the_module_at_each_call():
    """``tiers/allocator.py`` makes ``lmcache.utils._shared_observability_lock``
    re-entrant (a pool buffer the collector frees inside a stats method would
    otherwise deadlock its thread); that only works while ``thread_safe`` looks
    the lock up in the module's globals at each call, not once at decoration."""
    import lmcache.utils

    wrapper = lmcache.utils.thread_safe(lambda: None)
    assert "_shared_observability_lock" in wrapper.__code__.co_names
    assert wrapper.__globals__ is vars(lmcache.utils)
    lock = lmcache.utils._shared_observability_lock
    assert lock.acquire(blocking=False) and lock.acquire(blocking=False)  # re-entrant
    lock.release()
    lock.release()


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


def test_the_cpu_tier_keeps_lmcaches_chunk_statistics_out_of_its_puts(cache):
    """ECLocalCPUBackend replaces ``LocalCPUBackend.cache_policy`` (an
    ``LRUCachePolicy``, which upstream's ``submit_put_task`` calls as
    ``update_on_put``) by a subclass whose ``update_on_put``/``update_on_hit``
    skip the KV-chunk reuse statistics: ``LMCStatsMonitor``'s
    ``interval_request_cache_lifespan`` is cleared only by LMCache's KV stats
    logger, never run for this tier, and would grow with every put."""
    from lmcache.observability import LMCStatsMonitor

    assert isinstance(cache._cpu.cache_policy, LRUCachePolicy), _says(
        "LocalCPUBackend.cache_policy", "tiers/local_cpu.py", "a policy without statistics"
    )
    assert _params(LRUCachePolicy.update_on_put)[:2] == ["self", "key"]
    assert _params(LRUCachePolicy.update_on_hit)[:3] == ["self", "key", "cache_dict"]
    monitor = LMCStatsMonitor.GetOrCreate()
    before = len(monitor.interval_request_cache_lifespan)
    for _ in range(3):
        cache.put("statistics", torch.ones(2, 8))
        cache.remove("statistics")
    assert len(monitor.interval_request_cache_lifespan) == before, _says(
        "LRUCachePolicy.update_on_put/update_on_hit as its only statistics hooks",
        "tiers/local_cpu.py",
        "puts that leave LMCache's KV statistics flat",
    )


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


# -- the directory tiers (tiers/frame_directory.py, tiers/node.py) -------------------


def test_storage_backend_interface_is_what_frame_directory_implements():
    """The disk and node tiers implement LMCache's public ``StorageBackendInterface``
    (no subclass of ``LocalDiskBackend``): a new abstract method upstream must be
    implemented before they can be built."""
    missing = set(StorageBackendInterface.__abstractmethods__) - {
        name for name in dir(FrameDirectoryTier) if callable(getattr(FrameDirectoryTier, name))
    }
    assert not missing, _says(
        f"StorageBackendInterface (new abstract methods {sorted(missing)})",
        "tiers/frame_directory.py",
        "the disk and node tiers",
    )
    assert not getattr(FrameDirectoryTier, "__abstractmethods__", None), _says(
        "StorageBackendInterface's abstract methods", "tiers/frame_directory.py", "building tiers"
    )


def test_local_cpu_backend_use_hot_turns_its_cache_off(cache):
    """With the node tier on, the CPU tier keeps no entries: ``use_hot = False``
    makes upstream's ``submit_put_task`` drop them (the pool only stages)."""
    cpu = cache._storage.storage_backends["LocalCPUBackend"]
    assert isinstance(cpu.use_hot, bool), _says(
        "LocalCPUBackend.use_hot", "storage/manager.py", "a CPU pool that only stages"
    )


# -- the storage manager (storage/manager.py, engine.py) -----------------------------


def test_storage_manager_builds_backends_through_create_backends(cache):
    """ECStorageManager overrides ``create_backends`` (called by
    StorageManager.__init__) to build our tiers first; upstream then skips names
    already in ``storage_backends``. It uses ``manager_lock``, ``loop`` and
    ``thread`` (stopped when a tier fails to build, or at exit when the program
    never closed its cache; the loop's default executor is shut down on close,
    which upstream leaves running)."""
    storage = cache._storage
    assert isinstance(storage, StorageManager)
    assert _params(StorageManager.__init__)[:4] == ["self", "config", "metadata", "event_manager"]
    for name in ("storage_backends", "manager_lock", "loop", "thread", "config", "metadata"):
        assert hasattr(storage, name), _says(
            f"StorageManager.{name}", "storage/manager.py", "building and closing tiers"
        )
    assert isinstance(storage.loop, asyncio.AbstractEventLoop)
    assert isinstance(storage.thread, threading.Thread) and storage.thread.is_alive(), _says(
        "StorageManager.thread", "storage/manager.py", "stopping an unclosed cache's loop at exit"
    )
    assert list(storage.storage_backends)[:2] == ["LocalCPUBackend", "LocalDiskBackend"], _says(
        "StorageManager.storage_backends' names", "storage/manager.py", "the tier order"
    )
    names = [name for name, _ in storage.get_active_storage_backends()]
    assert names == list(storage.storage_backends), _says(
        "StorageManager.get_active_storage_backends", "storage/manager.py", "tiers()"
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


def test_remote_backend_state_it_manages():
    """ECRemoteBackend keeps upstream's structure and drives its state:
    ``connection`` (re)built by ``init_connection``, ``put_tasks`` under ``lock``
    (uploads in flight, de-duplicated), ``serializer`` (a frame into bytes),
    ``failure_time``/``min_reconnect_interval`` (upstream's reconnect pacing)."""
    source = inspect.getsource(RemoteBackend)
    for name in (
        "self.connection",
        "self.put_tasks",
        "self.lock",
        "self.serializer",
        "self.failure_time",
        "self.min_reconnect_interval",
    ):
        assert name in source, _says(f"RemoteBackend.{name[5:]}", "remote/backend.py", "uploads")
    assert callable(getattr(RemoteBackend, "init_connection", None)), _says(
        "RemoteBackend.init_connection", "remote/backend.py", "reconnecting"
    )


def test_remote_metadata_fields():
    """Redis entries carry LMCache's ``RemoteMetadata`` next to the frame, the
    naming a plain LMCache Redis writer uses (remote/redis_store.py)."""
    assert _params(RemoteMetadata.__init__)[1:5] == ["length", "shapes", "dtypes", "fmt"], _says(
        "RemoteMetadata's fields", "remote/redis_store.py", "the metadata key"
    )
    from lmcache.v1 import protocol

    assert hasattr(protocol, "REMOTE_METADATA_FMT") and callable(
        getattr(protocol, "init_remote_metadata_info", None)
    ), _says("protocol.init_remote_metadata_info", "remote/redis_store.py", "metadata keys")
    if protocol.REMOTE_METADATA_FMT is None:
        protocol.init_remote_metadata_info(1)
    meta = RemoteMetadata(8, [torch.Size([8])], [torch.uint8], MemoryFormat.EC_TD)
    assert isinstance(meta.serialize(), (bytes, bytearray)), _says(
        "RemoteMetadata.serialize", "remote/redis_store.py", "the metadata key"
    )
    assert hasattr(MemoryFormat, "EC_TD"), _says(
        "MemoryFormat.EC_TD", "remote/, tiers/", "encoder frames in CPU buffers"
    )


def test_config_definitions_name_lmcache_keys():
    """``ec:`` refuses LMCache keys naming the replacement; which keys are
    LMCache's comes from ``lmcache.v1.config._CONFIG_DEFINITIONS`` (config.py)."""
    from lmcache.v1.config import _CONFIG_DEFINITIONS

    assert "chunk_size" in _CONFIG_DEFINITIONS and "remote_url" in _CONFIG_DEFINITIONS, _says(
        "lmcache.v1.config._CONFIG_DEFINITIONS", "config.py", "naming LMCache keys in errors"
    )


# -- gauges (tiers/local_cpu.py, storage/manager.py) ---------------------------------


def test_lmcache_registers_its_gauges_in_setup_metrics():
    """ECLocalCPUBackend and ECStorageManager override ``_setup_metrics`` with
    nothing: upstream's registers gauges closing over the backend (and so the
    pool) in a process-wide logger that outlives every cache."""
    for owner in (LocalCPUBackend, StorageManager):
        assert "self._setup_metrics()" in inspect.getsource(owner.__init__), _says(
            f"{owner.__name__}._setup_metrics (called by its constructor)",
            "tiers/local_cpu.py, storage/manager.py",
            "keeping a closed cache's pool out of LMCache's process-wide gauges",
        )
        assert "set_function" in inspect.getsource(owner._setup_metrics)
