"""A disk directory that cannot be made or listed at start: the engine starts without it.

Real paths this user cannot use whoever it is (root included): a regular file
where the directory should be, and a directory under a regular file. The
cache starts on its other tiers, says so in one warning naming the directory
and the reason, and reports ``disk_tier`` in ``features_off`` and the
``lmcache_ec_feature_off`` gauge. Another user's directory is
``tests/chaos/test_unusable_disk_dir.py``.
"""

from __future__ import annotations

import logging

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from lmcache_ec.metrics_export import register
from tests.conftest import bit_equal, make_tensor


def _disk_off_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("disk_tier off")]


@pytest.mark.parametrize("where", ["a-file", "a-file/store"])
def test_the_engine_starts_without_a_disk_tier_it_cannot_use(
    tmp_path, where, local_config, make_cache, caplog
):
    (tmp_path / "a-file").write_text("not a directory")
    unusable = tmp_path / where
    with caplog.at_level(logging.WARNING):
        cache = make_cache({**local_config, "local_disk": str(unusable)}, model="m/no-disk")
    assert cache.tiers == ["cpu"]  # nor upstream's own disk backend in its place
    assert cache.stats.snapshot()["features_off"] == {"disk_tier": "directory_unusable"}
    tensor = make_tensor((8, 64), torch.float16)
    assert cache.put("a", tensor)
    assert cache.flush(10)
    assert bit_equal(cache.get("a"), tensor)
    said = _disk_off_warnings(caplog)
    assert len(said) == 1, said
    assert str(unusable) in said[0] and "Not a directory" in said[0]
    assert not [r for r in caplog.records if "size check" in r.getMessage()]
    registry = CollectorRegistry()
    register(cache, registry)
    page = generate_latest(registry).decode()
    assert (
        'lmcache_ec_feature_off{feature="disk_tier",model="m/no-disk",namespace="default",'
        'reason="directory_unusable"} 1.0' in page
    )


def test_a_usable_disk_directory_is_no_feature_off(make_cache, caplog):
    with caplog.at_level(logging.WARNING):
        cache = make_cache()
    assert cache.tiers == ["cpu", "disk"]
    assert cache.stats.snapshot()["features_off"] == {}
    assert not _disk_off_warnings(caplog)
