"""The disk tier: persistence across processes, capacity, temporary files."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from lmcache_ec import ECCache
from lmcache_ec.tiers.disk_layout import TEMP_PREFIX, DirectoryLayout
from tests.conftest import bit_equal, make_tensor

ROOT = Path(__file__).resolve().parents[2]

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


def test_entries_written_by_another_process_survive_its_exit(disk_dir, make_cache):
    subprocess.run(
        [sys.executable, "-c", WRITER, str(disk_dir), "12"],
        check=True,
        cwd=ROOT,
        env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR"},
    )
    cache = make_cache(model="org/vlm", dtype=torch.bfloat16)
    for i in range(12):
        assert cache.contains(f"image-{i}") == "disk"
        out = cache.get(f"image-{i}")
        assert out is not None
        assert bit_equal(out, make_tensor((256, 2560), torch.bfloat16, seed=i))
    assert cache.get("image-12") is None


def test_entries_written_while_running_are_found(disk_dir, make_cache):
    cache = make_cache(model="org/vlm", dtype=torch.bfloat16)
    assert cache.contains("image-0") is None
    subprocess.run(
        [sys.executable, "-c", WRITER, str(disk_dir), "2"],
        check=True,
        cwd=ROOT,
        env={**os.environ, "LMCACHE_LOG_LEVEL": "ERROR"},
    )
    assert cache.contains("image-1") == "disk"
    assert bit_equal(cache.get("image-0"), make_tensor((256, 2560), torch.bfloat16, seed=0))


def _disk_only(disk_dir, frames: float, frame: int) -> dict:
    """No CPU tier: every read is a disk read; room for ``frames`` frames."""
    return {
        "local_cpu": False,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "max_local_disk_size": frame * frames / 1024**3,
        "min_residency_s": 0,  # each test's earlier engines left entries to evict
    }


def _stored(cache: ECCache, names: list[str]) -> list[str]:
    return [name for name in names if cache.contains(name) == "disk"]


def test_disk_capacity_evicts_least_recently_used(disk_dir, make_cache):
    frame = 256 * 1024 * 2 + 4096
    config = _disk_only(disk_dir, 3.5, frame)
    names = [f"img-{i}" for i in range(5)]
    tensors = {
        name: make_tensor((256, 1024), torch.float16, seed=i) for i, name in enumerate(names)
    }
    with make_cache(config) as cache:
        for name in names[:3]:
            assert cache.put(name, tensors[name])
            assert cache.flush()
        # A hit makes img-0 the most recently used: the next overflow takes img-1.
        assert bit_equal(cache.get("img-0"), tensors["img-0"])
        assert cache.put("img-3", tensors["img-3"])
        assert cache.flush()
        assert len(list(disk_dir.glob("*.pt"))) == 3
        assert _stored(cache, names[:4]) == ["img-0", "img-2", "img-3"]
        # Again, the other way round: img-2 read, so img-0 is now the oldest.
        assert bit_equal(cache.get("img-2"), tensors["img-2"])
        assert cache.put("img-4", tensors["img-4"])
        assert cache.flush()
        assert _stored(cache, names) == ["img-2", "img-3", "img-4"]
    # Restarting over a directory larger than the configured size trims it.
    cache = make_cache(_disk_only(disk_dir, 2.5, frame))
    assert len(list(disk_dir.glob("*.pt"))) == 2
    assert cache.contains("img-4") == "disk"


def test_lru_order_survives_restart(disk_dir, make_cache):
    frame = 64 * 1024 * 4 + 4096
    names = [f"img-{i}" for i in range(4)]
    tensors = {name: make_tensor((64, 1024), torch.float32, seed=i) for i, name in enumerate(names)}
    with make_cache(_disk_only(disk_dir, 1024, frame)) as cache:
        for name in names[:3]:
            assert cache.put(name, tensors[name])
            assert cache.flush()
            time.sleep(0.01)  # distinct mtimes
    # The rebuilt index is in write order: trimming takes the oldest entry.
    with make_cache(_disk_only(disk_dir, 2.5, frame)) as cache:
        assert _stored(cache, names[:3]) == ["img-1", "img-2"]
    # And hits on the rebuilt index refresh recency: img-1 read, img-2 goes.
    with make_cache(_disk_only(disk_dir, 2.5, frame)) as cache:
        assert bit_equal(cache.get("img-1"), tensors["img-1"])
        assert cache.put("img-3", tensors["img-3"])
        assert cache.flush()
        assert _stored(cache, names) == ["img-1", "img-3"]
    cache = make_cache(_disk_only(disk_dir, 2.5, frame))
    assert _stored(cache, names) == ["img-1", "img-3"]


def test_a_restart_lists_the_directory_once(disk_dir, make_cache, monkeypatch, caplog):
    # Listing a directory of 100,000 entries takes over a second: the start-up
    # trim's listing also gives the count it reports, none is taken for it alone.
    frame = 64 * 1024 * 4 + 4096
    names = [f"img-{i}" for i in range(4)]
    with make_cache(_disk_only(disk_dir, 1024, frame)) as cache:
        for i, name in enumerate(names):
            assert cache.put(name, make_tensor((64, 1024), torch.float32, seed=i))
        assert cache.flush()
    listings = []
    scan = DirectoryLayout.scan

    def counted(layout, *args, **kwargs):
        listings.append(layout.path)
        return scan(layout, *args, **kwargs)

    monkeypatch.setattr(DirectoryLayout, "scan", counted)
    with caplog.at_level(logging.INFO, logger="lmcache_ec.tiers.frame_directory"):
        cache = make_cache(_disk_only(disk_dir, 2.5, frame))
    assert listings == [str(disk_dir)]
    assert f"{disk_dir}: 2 entries (2 evicted to fit" in caplog.text
    assert _stored(cache, names) == ["img-2", "img-3"]


def test_stale_temporary_files_are_cleaned_and_fresh_ones_kept(disk_dir, make_cache):
    writer = os.getpid()  # alive: only age makes its temp file stale
    stale = disk_dir / f"{TEMP_PREFIX}{writer}-2.ec1.a.b"
    fresh = disk_dir / f"{TEMP_PREFIX}{writer}-4.ec1.a.b"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    (disk_dir / "unrelated.txt").write_text("kept")
    with make_cache() as cache:
        assert cache.contains("anything") is None
    assert not stale.exists() and fresh.exists()
    assert (disk_dir / "unrelated.txt").exists()


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o7777


@pytest.mark.parametrize(
    ("group_shared", "dir_mode", "file_mode"),
    [(False, 0o700, 0o600), (True, 0o2770, 0o660)],
    ids=["private", "group-shared"],
)
def test_directory_and_entries_are_private_unless_shared_with_a_group(
    tmp_path, group_shared, dir_mode, file_mode, make_cache
):
    """Stored embeddings can reveal image content: by default only this user can
    read them, whatever the umask; a group-shared directory is an explicit setting."""
    directory = tmp_path / "new" / "store"
    config = {
        "max_local_cpu_size": 0.05,
        "local_disk": str(directory),
        "local_disk_group_shared": group_shared,
    }
    umask = os.umask(0o022)  # the usual default, which would give 0755 / 0644
    try:
        with make_cache(config) as cache:
            assert cache.put("x", make_tensor((4, 8), torch.float32))
            assert cache.flush(10)
            shutil.rmtree(directory)  # deleted under a running engine: made again alike
            assert cache.put("y", make_tensor((4, 8), torch.float32))
            assert cache.flush(10)
    finally:
        os.umask(umask)
    assert _mode(directory) == dir_mode
    (entry,) = directory.glob("*.pt")
    assert _mode(entry) == file_mode


def test_group_sharing_turned_on_for_a_private_directory_says_what_it_needs(
    disk_dir, make_cache, caplog
):
    """The directory was made private (0700) by an earlier config: turning
    ``local_disk_group_shared`` on does not open it (only its owner may, and
    the group must be the sharing one), so the start says what to run."""
    disk_dir.mkdir(exist_ok=True)
    os.chmod(disk_dir, 0o700)
    with caplog.at_level(logging.WARNING, logger="lmcache_ec.tiers.frame_directory"):
        make_cache({"local_disk": str(disk_dir), "local_disk_group_shared": True})
    said = [r.getMessage() for r in caplog.records if "users of its group" in r.getMessage()]
    assert len(said) == 1 and "chmod 2770" in said[0] and "0700" in said[0]
    caplog.clear()
    os.chmod(disk_dir, 0o2770)
    with caplog.at_level(logging.WARNING, logger="lmcache_ec.tiers.frame_directory"):
        make_cache({"local_disk": str(disk_dir), "local_disk_group_shared": True})
    assert not [r for r in caplog.records if "users of its group" in r.getMessage()]
