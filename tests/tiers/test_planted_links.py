"""A symlink planted under an entry's name costs the size limit nothing
(``budget.py``, ``disk_layout.py``): its target lies outside the directory,
so a scan counts it at 0 bytes and the removal of it as damaged subtracts
nothing from the ledger (subtracting the target's size was an under-count:
later writes then filled the directory past its limit).
"""

from __future__ import annotations

import os

import torch

from lmcache_ec.tiers.disk_layout import DirectoryLayout
from tests.conftest import make_tensor

BIG = 64 * 1024**2  # the link's target: far more than the entries (sparse)


def _plant_link(cache, tmp_path, mm_hash: str) -> str:
    target = tmp_path / "big"
    with open(target, "wb") as stream:
        stream.truncate(BIG)
    path = cache._disk.path_of(cache.key(mm_hash))
    os.symlink(target, path)
    return path


def _entry_bytes(directory: str) -> int:
    return sum(
        os.path.getsize(e.path) for e in os.scandir(directory) if e.is_file(follow_symlinks=False)
    )


def _filled(make_cache):
    cache = make_cache()
    for i in range(4):
        assert cache.put(f"img-{i}", make_tensor((64, 256), torch.float16, seed=i))
    assert cache.flush(10)
    return cache


def test_a_symlink_removed_as_damaged_takes_none_of_its_targets_bytes_off_the_ledger(
    make_cache, tmp_path
):
    cache = _filled(make_cache)
    disk = cache._disk
    _plant_link(cache, tmp_path, "planted")
    assert cache.get("planted") is None
    assert disk.counters["damaged"] == 1
    assert disk.budget.ledger() == _entry_bytes(disk.path)


def test_a_scan_counts_a_symlink_under_an_entry_name_at_nothing(make_cache, tmp_path):
    cache = _filled(make_cache)
    path = _plant_link(cache, tmp_path, "planted")
    scan = DirectoryLayout(cache._disk.path).scan(reclaim=False)
    assert scan.total == _entry_bytes(cache._disk.path)
    assert [e.size for e in scan.entries if e.path == path] == [0]  # listed, for removal
