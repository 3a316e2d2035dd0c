"""A storage plugin LMCache adds after our tiers is a tier like the others.

``DictStore`` is a real LMCache storage plugin (``StorageBackendInterface``,
loaded by LMCache's ``storage_plugin_launcher`` from ``storage_plugins``);
the engine reaches it only through ``PluginTier``.
"""

from __future__ import annotations

import threading

import torch
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface

from lmcache_ec import ECCache
from lmcache_ec.storage.manager import PluginTier
from lmcache_ec.tier_contract import Tier, TierKind
from tests.conftest import make_tensor

PLUGIN = "dictstore"


class DictStore(StorageBackendInterface):
    """Frames kept as bytes in a dict, read back into CPU-pool buffers: the
    smallest complete plugin, with a store's copy semantics."""

    def __init__(self, config, dst_device, metadata, local_cpu_backend, loop) -> None:
        super().__init__(dst_device="cpu")
        self.local_cpu_backend = local_cpu_backend
        self.entries: dict = {}
        self.lock = threading.Lock()

    def contains(self, key, pin: bool = False) -> bool:
        with self.lock:
            return key in self.entries

    def exists_in_put_tasks(self, key) -> bool:
        return False

    def batched_submit_put_task(self, keys, memory_objs, transfer_spec=None, **kwargs):
        with self.lock:
            for key, memory_obj in zip(keys, memory_objs, strict=True):
                self.entries.setdefault(key, bytearray(memory_obj.byte_array))

    def get_blocking(self, key):
        with self.lock:
            data = self.entries.get(key)
        if data is None:
            return None
        memory_obj = self.local_cpu_backend.allocate(
            torch.Size([len(data)]), torch.uint8, MemoryFormat.EC_TD, busy_loop=False
        )
        if memory_obj is not None:
            memory_obj.raw_tensor[: len(data)].copy_(torch.frombuffer(data, dtype=torch.uint8))
        return memory_obj

    def pin(self, key) -> bool:
        return False

    def unpin(self, key) -> bool:
        return False

    def remove(self, key, force: bool = True) -> bool:
        with self.lock:
            return self.entries.pop(key, None) is not None

    def get_allocator_backend(self):
        return self.local_cpu_backend

    def close(self) -> None:
        with self.lock:
            self.entries.clear()


def _add_plugin(cache: ECCache) -> None:
    # LMCache's own route for backends added to a running manager: config, then
    # create_backends (existing backends are skipped, new ones built after them).
    config = cache._storage.config
    config.storage_plugins = [PLUGIN]
    config.extra_config = {
        **(config.extra_config or {}),
        f"storage_plugin.{PLUGIN}.module_path": __name__,
        f"storage_plugin.{PLUGIN}.class_name": "DictStore",
    }
    created = cache._storage.create_backends()
    assert created == {PLUGIN: "DictStore"}


def test_a_storage_plugin_is_wrapped_and_read_through_the_contract(make_cache):
    config = {"local_cpu": True, "max_local_cpu_size": 0.02}
    cache = make_cache(config, model="org/plugin-model")
    _add_plugin(cache)
    tiers = cache._storage.tiers()
    assert [tier.name for tier in tiers] == ["cpu", PLUGIN]
    plugin = tiers[-1]
    assert isinstance(plugin, PluginTier) and isinstance(plugin, Tier)
    assert plugin.kind is TierKind.PLUGIN and plugin.backend_name == PLUGIN
    assert cache._storage.tiers()[-1] is plugin  # one adapter per backend
    assert cache.tiers == ["cpu", PLUGIN]

    tensor = make_tensor((16, 64), torch.float16, seed=3)
    assert cache.put("img", tensor)
    key = cache.key("img")
    assert cache._cpu.remove(key, force=True)
    assert cache.contains("img") == PLUGIN

    # A plugin hit is verified, served and promoted to the CPU tier.
    got = cache.get("img")
    assert got is not None and torch.equal(got, tensor)
    assert cache.stats.snapshot()["hits"] == {PLUGIN: 1}
    assert cache.contains("img") == "cpu"

    assert cache.remove("img")
    assert cache.contains("img") is None
    assert cache.get("img") is None


def test_a_corrupt_plugin_entry_is_a_miss_and_dropped_everywhere(make_cache):
    config = {"local_cpu": True, "max_local_cpu_size": 0.02}
    cache = make_cache(config, model="org/plugin-model")
    _add_plugin(cache)
    tensor = make_tensor((16, 64), torch.float16, seed=4)
    assert cache.put("img", tensor)
    key = cache.key("img")
    assert cache._cpu.remove(key, force=True)
    store = cache._storage.storage_backends[PLUGIN]
    frame = store.entries[key]
    frame[-1] ^= 0xFF  # flipped payload bytes
    frame[len(frame) // 2] ^= 0xFF
    assert cache.get("img") is None
    assert cache.stats.snapshot()["integrity_failures"] == 1
    assert key not in store.entries
