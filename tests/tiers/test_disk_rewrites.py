"""Two engines on one disk directory never write the same entry twice."""

from __future__ import annotations

import os

import torch

from tests.conftest import bit_equal, make_tensor


def test_entry_written_by_another_engine_is_not_rewritten(disk_dir, make_cache):
    tensor = make_tensor((64, 128), torch.bfloat16, seed=3)
    with (
        make_cache(model="org/vlm", dtype=torch.bfloat16) as first,
        make_cache(model="org/vlm", dtype=torch.bfloat16) as second,
    ):
        # Both started on an empty directory: neither has the other's entry indexed.
        assert first.put("image", tensor)
        assert first.flush(10.0)
        [entry] = [name for name in os.listdir(disk_dir) if name.endswith(".pt")]
        written = os.stat(disk_dir / entry)

        # The second engine computed the same output (a miss it could not load).
        assert second.put("image", tensor)
        assert second.flush(10.0)
        again = os.stat(disk_dir / entry)
        assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
        assert second.stats.snapshot()["tiers"]["disk"]["skipped_existing"] == 1
        assert bit_equal(second.get("image"), tensor)
