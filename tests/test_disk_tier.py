"""The disk tier: persistence across processes, containment, integrity."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from lmcache_ec import ECCache
from lmcache_ec.key import ECKey
from tests.conftest import bit_equal, make_tensor
from tests.test_key import HOSTILE_MM_HASHES

ROOT = Path(__file__).resolve().parent.parent

WRITER = textwrap.dedent(
    """
    import sys, torch
    from lmcache_ec import ECCache
    from tests.conftest import make_tensor
    config = {"local_cpu": True, "max_local_cpu_size": 0.1,
              "local_disk": sys.argv[1], "max_local_disk_size": 1}
    with ECCache.from_config(config, model="org/vlm", dtype=torch.bfloat16) as cache:
        for i in range(int(sys.argv[2])):
            assert cache.put(f"image-{i}", make_tensor((256, 2560), torch.bfloat16, seed=i))
    """
)


def files_under(path: Path) -> set[Path]:
    return {p for p in path.rglob("*") if p.is_file()}


def test_entries_written_by_another_process_survive_its_exit(local_config, disk_dir):
    subprocess.run(
        [sys.executable, "-c", WRITER, str(disk_dir), "12"],
        check=True,
        cwd=ROOT,
        env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR"},
    )
    with ECCache.from_config(local_config, model="org/vlm", dtype=torch.bfloat16) as cache:
        for i in range(12):
            assert cache.contains(f"image-{i}") == "disk"
            out = cache.get(f"image-{i}")
            assert out is not None
            assert bit_equal(out, make_tensor((256, 2560), torch.bfloat16, seed=i))
        assert cache.get("image-12") is None


def test_entries_written_while_running_are_found(local_config, disk_dir):
    with ECCache.from_config(local_config, model="org/vlm", dtype=torch.bfloat16) as cache:
        assert cache.contains("image-0") is None
        subprocess.run(
            [sys.executable, "-c", WRITER, str(disk_dir), "2"],
            check=True,
            cwd=ROOT,
            env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR"},
        )
        assert cache.contains("image-1") == "disk"
        assert bit_equal(cache.get("image-0"), make_tensor((256, 2560), torch.bfloat16, seed=0))


def test_hostile_mm_hashes_stay_inside_the_cache_dir(tmp_path, local_config, disk_dir):
    before = files_under(tmp_path)
    tensors = {
        h: make_tensor((4, 8), torch.float32, seed=i) for i, h in enumerate(HOSTILE_MM_HASHES)
    }
    with ECCache.from_config(local_config, model="../../model", namespace="../ns") as cache:
        for mm_hash, tensor in tensors.items():
            assert cache.put(mm_hash, tensor)
        assert cache.flush()
    created = files_under(tmp_path) - before
    assert len(created) == len(tensors)
    for path in created:
        assert path.parent == disk_dir
        assert ECKey.is_storage_name(path.name.removesuffix(".pt"))
    with ECCache.from_config(local_config, model="../../model", namespace="../ns") as cache:
        for mm_hash, tensor in tensors.items():
            assert cache.contains(mm_hash) == "disk"
            assert bit_equal(cache.get(mm_hash), tensor)


def only_file(disk_dir: Path) -> Path:
    (path,) = disk_dir.glob("*.pt")
    return path


@pytest.mark.parametrize(
    "damage",
    ["flip-payload", "flip-header", "truncate", "truncate-to-prefix", "empty", "garbage"],
)
def test_damaged_file_is_a_miss_and_is_removed(local_config, disk_dir, damage):
    tensor = make_tensor((256, 2560), torch.bfloat16)
    with ECCache.from_config(local_config, model="m") as cache:
        cache.put("img", tensor)
    path = only_file(disk_dir)
    data = bytearray(path.read_bytes())
    if damage == "flip-payload":
        data[len(data) // 2] ^= 0x01
    elif damage == "flip-header":
        data[80] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) - 1000]
    elif damage == "truncate-to-prefix":
        data = data[:32]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(os.urandom(len(data)))
    path.write_bytes(bytes(data))

    with ECCache.from_config(local_config, model="m") as cache:
        assert cache.get("img") is None
        assert not path.exists()
        assert cache.stats.snapshot()["integrity_failures"] == 1
        assert cache.contains("img") is None
        # The slot is usable again.
        assert cache.put("img", tensor)
        assert bit_equal(cache.get("img"), tensor)


def test_file_deleted_under_the_engine_is_a_plain_miss(local_config, disk_dir):
    config = dict(local_config, local_cpu=False)
    with ECCache.from_config(config, model="m") as cache:
        cache.put("img", torch.ones(4, 4))
        assert cache.flush()
        only_file(disk_dir).unlink()
        assert cache.get("img") is None
        assert cache.stats.snapshot()["integrity_failures"] == 0


def test_disk_capacity_evicts_least_recently_used(disk_dir):
    frame = 256 * 1024 * 2 + 4096
    config = {
        "local_cpu": False,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "max_local_disk_size": frame * 3.5 / 1024**3,
    }
    tensors = [make_tensor((256, 1024), torch.float16, seed=i) for i in range(5)]
    with ECCache.from_config(config, model="m") as cache:
        for i, tensor in enumerate(tensors):
            assert cache.put(f"img-{i}", tensor)
            assert cache.flush()
        assert len(list(disk_dir.glob("*.pt"))) == 3
        assert [cache.contains(f"img-{i}") for i in range(5)] == [
            None,
            None,
            "disk",
            "disk",
            "disk",
        ]
    # Restarting over a directory larger than the configured size trims it.
    smaller = dict(config, max_local_disk_size=frame * 2.5 / 1024**3)
    with ECCache.from_config(smaller, model="m") as cache:
        assert len(list(disk_dir.glob("*.pt"))) == 2
        assert cache.contains("img-4") == "disk"


def test_stale_temporary_files_are_cleaned_and_fresh_ones_kept(local_config, disk_dir):
    stale = disk_dir / "ec1.a.b.pt.tmp-1-2"
    fresh = disk_dir / "ec1.a.b.pt.tmp-3-4"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    (disk_dir / "unrelated.txt").write_text("kept")
    with ECCache.from_config(local_config, model="m") as cache:
        assert cache.contains("anything") is None
    assert not stale.exists() and fresh.exists()
    assert (disk_dir / "unrelated.txt").exists()


def test_lru_order_survives_restart(disk_dir):
    frame = 64 * 1024 * 4 + 4096
    config = {
        "local_cpu": False,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "max_local_disk_size": 1,
    }
    with ECCache.from_config(config, model="m") as cache:
        for i in range(3):
            cache.put(f"img-{i}", make_tensor((64, 1024), torch.float32, seed=i))
            assert cache.flush()
            time.sleep(0.01)  # distinct mtimes
    trimmed = dict(config, max_local_disk_size=frame * 2.5 / 1024**3)
    with ECCache.from_config(trimmed, model="m") as cache:
        assert [cache.contains(f"img-{i}") for i in range(3)] == [None, "disk", "disk"]
