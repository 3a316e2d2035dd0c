"""Start-up: engine construction with a large CPU tier, each in a fresh process.

Upstream's ``ECCacheEngine`` zero-fills its whole CPU pool before the first
request; ``ECCache`` reserves address space and touches pages on first use
(which the CPU tier's ``put (cold pool)`` row shows). Rounds alternate
between the two engines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from .measure import summary
from .rows import make_row

_STARTUP = r"""
import json, os, sys, time, torch
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
which, config = sys.argv[1], json.loads(sys.argv[2])
from lmcache_ec.bench.subjects import open_ours, open_upstream
# Construction only: both engines' modules (and LMCache's) are imported first.
import lmcache_ec.engine, lmcache.v1.ec_engine
before = rss(); started = time.perf_counter()
engine = (open_ours if which == "ours" else open_upstream)(config, torch.bfloat16)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "rss_bytes": rss() - before}))
engine.close()
"""


def measure_startup(which: str, config: dict[str, Any]) -> dict[str, Any]:
    """Construction time and RSS growth of one engine (``ours``/``upstream``), in a
    fresh process; ``{"error": [...]}`` if it failed."""
    env = {**os.environ, "LMCACHE_LOG_LEVEL": "WARNING"}
    done = subprocess.run(
        [sys.executable, "-c", _STARTUP, which, json.dumps(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_startup(
    cpu_gb: float, rounds: int, workdir: str, progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    directory = os.path.join(workdir, "startup")
    os.makedirs(directory, exist_ok=True)
    config = {
        "local_cpu": True,
        "max_local_cpu_size": cpu_gb,
        "local_disk": directory,
        "max_local_disk_size": 1.0,
    }
    seconds: dict[str, list[float]] = {"ours": [], "upstream": []}
    rss: dict[str, list[int]] = {"ours": [], "upstream": []}
    for r in range(rounds):
        for which in ("ours", "upstream") if r % 2 == 0 else ("upstream", "ours"):
            progress(f"start-up with {cpu_gb:g} GB, {which} (round {r + 1}/{rounds})")
            result = measure_startup(which, config)
            if "error" in result:
                raise RuntimeError(f"{which} start-up failed: {result['error']}")
            seconds[which].append(result["seconds"])
            rss[which].append(result["rss_bytes"])

    def measured(which: str, label: str, note: str) -> dict[str, Any]:
        growth = max(rss[which]) / 1024**2
        return summary(
            label,
            seconds[which],
            0,
            note=f"{note}; RSS +{growth:.0f} MB",
            rss_mb=round(growth, 1),
        )

    return [
        make_row(
            "cpu",
            f"start-up ({cpu_gb:g} GB CPU tier)",
            None,
            None,
            None,
            ours=measured("ours", "ECCache.from_config", "pool reserved, touched on use"),
            upstream=measured("upstream", "ECCacheEngine()", "pool zero-filled"),
            note="fresh process each; construction only",
        )
    ]
