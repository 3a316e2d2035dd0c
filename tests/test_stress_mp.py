"""Several processes share one disk directory: every read is a miss or the exact tensor."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = textwrap.dedent(
    """
    import random, sys, torch
    from lmcache_ec import ECCache
    from tests.conftest import bit_equal, make_tensor

    disk, seed = sys.argv[1], int(sys.argv[2])
    # No CPU hot cache and a disk tier smaller than the working set: every read goes
    # to files that other processes are writing and evicting at the same time.
    config = {"local_cpu": False, "max_local_cpu_size": 0.02, "local_disk": disk,
              "max_local_disk_size": 12 * 64 * 256 * 2 / 1024**3}
    rng = random.Random(seed)
    hits = misses = 0
    with ECCache.from_config(config, model="stress") as cache:
        for _ in range(150):
            i = rng.randrange(24)
            expected = make_tensor((64, 256), torch.float16, seed=i)
            if rng.random() < 0.4:
                cache.put(f"img-{i}", expected)
            else:
                out = cache.get(f"img-{i}")
                if out is None:
                    misses += 1
                else:
                    assert bit_equal(out, expected), f"wrong tensor for img-{i}"
                    hits += 1
        failures = cache.stats.snapshot()["integrity_failures"]
    print(hits, misses, failures)
    """
)


def test_processes_sharing_a_disk_directory(disk_dir):
    env = {**os.environ, "LMCACHE_LOG_LEVEL": "ERROR"}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(disk_dir), str(seed)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(3)
    ]
    total_hits = 0
    for worker in workers:
        out, err = worker.communicate(timeout=240)
        assert worker.returncode == 0, err[-3000:]
        hits, _misses, failures = map(int, out.split())
        total_hits += hits
        assert failures == 0  # atomic renames: no reader ever sees a torn file
    assert total_hits > 0
    leftovers = [p for p in disk_dir.iterdir() if ".tmp-" in p.name]
    assert not leftovers
