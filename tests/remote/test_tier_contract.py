"""Every tier the storage manager builds implements the declared tier contract."""

from __future__ import annotations

from lmcache_ec.tier_contract import Tier, TierKind

from .conftest import remote_config

MODEL = "org/contract-model"


def test_every_tier_implements_the_contract(remote, disk_dir, make_cache):
    config = remote_config(**remote, local_disk=str(disk_dir), max_local_disk_size=0.01)
    cache = make_cache(config, model=MODEL)
    backends = cache._storage.storage_backends
    kinds = {}
    for backend_name, backend in backends.items():
        assert isinstance(backend, Tier), f"{backend_name} does not implement Tier"
        assert backend.backend_name == backend_name
        kinds[backend.name] = backend.kind
    assert kinds == {"cpu": TierKind.CPU, "disk": TierKind.DISK, "remote": TierKind.REMOTE}
