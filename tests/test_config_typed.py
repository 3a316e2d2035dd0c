"""The typed config: one field per option, sizes in bytes, one default each, one
"shared tier" predicate that every place asking it uses, one namespace per engine."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import tempfile

import pytest
import torch

from lmcache_ec import ECCache
from lmcache_ec.config import (
    ECConfig,
    RemoteSettings,
    embedded_default,
    from_lmcache,
    load_config,
)
from lmcache_ec.config_schema import GB, REMOTE_FIELDS, SCHEMA, gb_to_bytes
from lmcache_ec.integration.vllm.connector import _open_catalog_factory
from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.worker import TierWorker
from lmcache_ec.key import EncoderIdentity
from lmcache_ec.purge.selection import open_remote
from lmcache_ec.tier_contract import TierKind
from lmcache_ec.tiers.disk_layout import entry_file
from lmcache_ec.tiers.node import node_path
from tests.conftest import make_tensor


@pytest.fixture
def node_base():
    base = tempfile.mkdtemp(prefix="ec-config-test-", dir="/dev/shm")
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _dead_port() -> int:
    """A local port nobody listens on: a remote tier that refuses every connection."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_every_option_is_one_typed_field():
    flat = {f.name for f in dataclasses.fields(ECConfig)} - {"remote", "source"}
    assert flat == set(SCHEMA) - set(REMOTE_FIELDS)
    remote = {f.name for f in dataclasses.fields(RemoteSettings)} - {"max_frame_bytes"}
    assert remote == set(REMOTE_FIELDS.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        load_config({}).namespace = "other"  # type: ignore[misc]


def test_sizes_in_bytes_are_the_configured_gigabytes():
    config = load_config(
        {"max_local_cpu_size": 0.5, "max_local_disk_size": 3, "max_node_size": 0.25}
    )
    assert gb_to_bytes(1) == GB == 1024**3
    assert (config.cpu_bytes, config.disk_bytes, config.node_bytes) == (
        GB // 2,
        3 * GB,
        GB // 4,
    )
    assert config.remote.max_frame_bytes == config.cpu_bytes  # no larger frame is read
    with ECCache(config, EncoderIdentity(model="org/sizes")) as cache:
        assert cache.cpu_capacity == config.cpu_bytes


def test_the_embedded_default_takes_its_sizes_from_the_schema(tmp_path):
    embedded = load_config()
    assert embedded.source == "embedded default"
    configured = load_config({"local_disk": str(tmp_path)})
    for name in ("local_cpu", "max_local_cpu_size", "max_local_disk_size"):
        assert getattr(embedded, name) == getattr(configured, name) == SCHEMA[name].default
    assert set(embedded_default()) == {"local_disk"}  # the only key it sets


def _configs(tmp_path, node_base) -> dict[str, dict]:
    cpu = {"max_local_cpu_size": 0.01, "local_disk": None, "remote_timeout": 0.2}
    dead = f"redis://127.0.0.1:{_dead_port()}"
    return {
        "cpu": cpu,
        "disk": {**cpu, "local_disk": str(tmp_path / "disk"), "max_local_disk_size": 0.01},
        "node": {**cpu, "node_tier": True, "node_dir": node_base, "max_node_size": 0.01},
        "remote-url": {**cpu, "remote_url": dead},
        "remote-plugin": {**cpu, "remote_storage_plugins": ["absent_plugin"]},
    }


SHARED = {"cpu": False, "disk": True, "node": True, "remote-url": True, "remote-plugin": True}


@pytest.mark.parametrize("name", sorted(SHARED))
def test_every_place_asking_for_a_shared_tier_agrees(name, tmp_path, node_base):
    """The worker (one rank writes), the storage manager (remote backends), the
    vLLM connector and the CLI (a remote catalog) read the same typed predicates:
    a catalog needs a remote_url store, which is a remote tier, which is shared."""
    config = load_config(_configs(tmp_path, node_base)[name])
    assert config.shared_tier is SHARED[name]
    has_url = config.remote.url is not None
    assert not has_url or config.remote.configured
    assert not config.remote.configured or config.shared_tier
    assert (_open_catalog_factory(config) is not None) is has_url
    catalog = open_remote(config)  # opening does not contact the server
    assert (catalog is not None) is has_url
    if catalog is not None:
        catalog.close()
    with ECCache(config, EncoderIdentity(model="org/shared")) as cache:
        assert ("remote" in cache.tiers) is config.remote.configured
        worker = TierWorker(
            cache,
            ConnectorSettings(),
            persistable=lambda identifier: True,
            is_producer=True,
            is_consumer=True,
            tp_size=2,
        )
        try:
            assert worker.shared_tier is config.shared_tier
        finally:
            worker.close()


def test_a_namespace_override_is_the_node_tiers_namespace_too(node_base, make_cache):
    source = {
        "max_local_cpu_size": 0.01,
        "local_disk": None,
        "node_tier": True,
        "node_dir": node_base,
        "max_node_size": 0.01,
        "namespace": "from-config",
    }
    cache = make_cache(source, model="org/ns", namespace="tenant-b")
    assert cache.identity.namespace == cache.config.namespace == "tenant-b"
    (node,) = [t for t in cache._storage.tiers() if t.kind is TierKind.NODE]
    assert node.directory == node_path(node_base, "tenant-b")
    assert from_lmcache(cache._storage.config).namespace == "tenant-b"
    assert cache.put("img", make_tensor((4, 8), torch.float32))
    cache.flush(timeout=10)
    stored = entry_file(cache.key("img").storage_name)
    assert os.path.exists(os.path.join(node.directory, stored))
