"""A full ``node_dir`` never stops the disk tier (``budget.py``).

The disk tier's size ledger lives in this user's runtime directory under
``node_dir`` (``/dev/shm`` by default: 64 MB in a Docker container), another
filesystem than the disk directory's. Where that filesystem is full, the
ledger cannot be written there:

- the disk tier, with room on its own filesystem, still stores its entries
  within its limit, on a ledger of this process's own, and says so in ONE
  warning naming the full ``node_dir`` (``shared_ledger`` off);
- a shared ledger that fails only at a later write costs that one write
  (which leaves no temp file behind for scans to count), not every write;
- a group-shared directory's ledger is in the directory itself: a full
  ``node_dir`` changes nothing for it.

The full filesystem is a real one: a tiny tmpfs, filled (the test runs as root).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import pytest
import torch

from lmcache_ec.tiers.budget import DirectoryBudget, ledger_dir
from lmcache_ec.tiers.disk_layout import DirectoryLayout, DirectoryModes, is_temp
from lmcache_ec.tiers.group_ledger import GROUP_LEDGER
from tests.conftest import bit_equal, make_tensor
from tests.faults.fs import tiny_tmpfs
from tests.tiers.budgets import entry_names, publish

SHAPE = (128, 1024)  # float16: 256 KB payload
FRAME = SHAPE[0] * SHAPE[1] * 2 + 4096  # a generous upper bound of one frame
LIMIT = 1000


@pytest.fixture
def full_node_dir() -> Iterator[str]:
    """A node directory like ``/dev/shm`` after a reboot, with no room left."""
    with tiny_tmpfs(1) as point:
        with open(os.path.join(point, "filler"), "wb", buffering=0) as stream:
            for chunk in (1 << 16, 4096, 1):
                with contextlib.suppress(OSError):  # ENOSPC: full at this chunk size
                    while stream.write(b"\0" * chunk):
                        pass
        assert os.statvfs(point).f_bavail == 0
        yield point


def _directory_bytes(directory) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_full_node_dir_leaves_the_disk_tier_storing_within_its_limit(
    full_node_dir, disk_dir, caplog, make_cache
):
    config = {
        "local_cpu": False,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "max_local_disk_size": FRAME * 3 / 1024**3,
        "min_residency_s": 0,
        "node_dir": full_node_dir,
    }
    tensors = [make_tensor(SHAPE, torch.float16, seed=i) for i in range(6)]
    with caplog.at_level(logging.WARNING, logger="lmcache_ec"):
        cache = make_cache(config)
        with cache:
            for i, tensor in enumerate(tensors):
                assert cache.put(f"img-{i}", tensor)
                assert cache.flush(10)
            assert cache.contains("img-5") == "disk"
            assert bit_equal(cache.get("img-5"), tensors[5])
            snapshot = cache.stats.snapshot()
    assert snapshot["tiers"]["disk"].get("failures", 0) == 0
    assert snapshot["features_off"] == {"shared_ledger": "directory_unusable"}
    assert 1 <= len(list(disk_dir.glob("*.pt"))) <= 3
    assert _directory_bytes(disk_dir) <= FRAME * 3  # the limit holds for this process
    warnings = _warnings(caplog)
    assert len(warnings) == 1, warnings  # no "size check at start failed", none per write
    assert warnings[0].startswith("shared_ledger off")
    assert f"node_dir {full_node_dir} is full" in warnings[0]


def test_a_shared_ledger_failing_at_a_write_costs_that_write_only(disk_dir, tmp_path, caplog):
    """The ledger, there already, cannot take its next value (``ENOSPC``): that
    reservation fails and leaves no temp file; the next ones move to a ledger
    of this process's own, which keeps the limit."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    budget = DirectoryBudget(DirectoryLayout(str(disk_dir)), LIMIT, 0.0, str(node_dir))
    stat = os.stat(disk_dir)
    ledger = os.path.join(ledger_dir(str(node_dir))[0], f"{stat.st_dev}-{stat.st_ino}")
    assert budget.ledger() is None and os.path.exists(ledger)  # the one the budget uses
    os.remove(ledger)
    os.symlink("/dev/full", ledger)  # every write to it: ENOSPC
    names = entry_names(12)
    with caplog.at_level(logging.WARNING, logger="lmcache_ec"):
        with pytest.raises(OSError):
            budget.reserve(names[0], 100)
        assert [n for n in os.listdir(disk_dir) if is_temp(n)] == []
        for name in names[1:]:
            publish(budget, name, 100)
    assert budget.unshared is not None
    assert budget.ledger() == DirectoryLayout(str(disk_dir)).scan().total <= LIMIT
    assert _directory_bytes(disk_dir) <= LIMIT
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith("shared_ledger off"), warnings


def test_a_group_shared_directory_keeps_its_own_ledger_when_node_dir_is_full(
    full_node_dir, disk_dir, caplog
):
    os.chmod(disk_dir, 0o2770)
    layout = DirectoryLayout(str(disk_dir), DirectoryModes.of(True))
    budget = DirectoryBudget(layout, LIMIT, 0.0, full_node_dir)
    with caplog.at_level(logging.WARNING, logger="lmcache_ec"):
        for name in entry_names(12):
            publish(budget, name, 100)
    assert budget.unshared is None
    assert (disk_dir / GROUP_LEDGER).read_text() == str(budget.ledger())
    assert budget.ledger() == layout.scan().total <= LIMIT
    assert _warnings(caplog) == []
