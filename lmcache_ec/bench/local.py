"""Local tiers: ``ECCache`` vs LMCache 0.5.6 ``ECCacheEngine``, same tiers, same run.

For each shape and dtype, ``iterations`` distinct entries are put and read:

- ``cpu/put``  time for ``put`` to return (both write the disk tier in the
  background), first into never-used pool memory, then (``warm pool``) into
  memory freed by removed entries.
- ``cpu/get``  entries in the CPU tier. Floor: ``tensor.clone()`` of the same tensor.
- ``disk/get`` entries only on disk, in the same process (CPU copies dropped).
  Upstream's ``get()`` reads only the CPU tier and returns None here; its
  ``StorageManager.get`` (which walks tiers) is measured as well.
  Floor: reading the same number of bytes from the page cache with ``readinto``.
- ``disk/get after restart`` a new engine on the same directory. Upstream's
  disk index starts empty, so both of its paths miss.
- ``startup`` engine construction time and RSS growth, each in a fresh
  process, with a ``startup_cpu_gb`` CPU tier (upstream zero-fills its pool).

Both engines live side by side and are measured interleaved, call by call,
in an order that flips every iteration. Misses are counted and reported next
to the latency: a fast ``None`` is not a fast read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..key import SUPPORTED_DTYPES
from . import result_row

OURS = "lmcache-ec"
UPSTREAM = "ECCacheEngine"
UPSTREAM_WALK = "ECCacheEngine (StorageManager.get)"
FLOOR = "floor"
COLD_NOTE = "first use of CPU-pool memory (upstream zero-filled it at start)"


@dataclass
class LocalBenchSettings:
    shapes: list[tuple[int, int]] = field(default_factory=lambda: [(256, 2560)])
    dtypes: list[str] = field(default_factory=lambda: ["bfloat16"])
    iterations: int = 100
    cpu_gb: float = 1.0
    disk_gb: float = 4.0
    startup_cpu_gb: float = 2.0
    startup: bool = True
    # Intra-op threads for tensor copies. 1 by default: MB-sized copies gain
    # nothing from more, and on a busy machine waking OpenMP workers costs
    # whole scheduler slices (ms), drowning what is being measured.
    threads: int = 1
    directory: str | None = None  # default: a temporary directory, removed after


def _row(
    tier: str,
    op: str,
    engine: str,
    shape: Any,
    dtype: str,
    times: list[float],
    hits: int | None = None,
    note: str = "",
) -> dict[str, Any]:
    return result_row(tier, op, engine, shape, dtype, times, hits=hits, note=note)


def _timed(fn: Callable[[int], Any], n: int, expected: torch.Tensor | None = None):
    """Per-call seconds and, with ``expected``, how many results equal it.

    Results are checked and dropped at once: holding them would make every
    later call fault in fresh pages, and penalise whichever engine runs first.
    """
    times, hits = [], 0
    for i in range(n):
        started = time.perf_counter()
        out = fn(i)
        times.append(time.perf_counter() - started)
        if expected is not None and _same(out, expected):
            hits += 1
        del out
    return times, hits


def _same(a: Any, b: torch.Tensor) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    )


def _wait_upstream_disk(engine: Any, timeout: float = 60.0) -> None:
    disk = engine._storage_manager.storage_backends.get("LocalDiskBackend")
    deadline = time.monotonic() + timeout
    while disk is not None and time.monotonic() < deadline:
        with disk.disk_worker.put_lock:
            if not disk.disk_worker.put_tasks:
                return
        time.sleep(0.002)


def _tier_config(directory: str, settings: LocalBenchSettings) -> dict[str, Any]:
    return {
        "local_cpu": True,
        "max_local_cpu_size": settings.cpu_gb,
        "local_disk": directory,
        "max_local_disk_size": settings.disk_gb,
    }


def _upstream(config: dict[str, Any], dtype: torch.dtype) -> Any:
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.ec_engine import ECCacheEngine

    from ..engine import _lmcache_metadata

    return ECCacheEngine(
        LMCacheEngineConfig.from_defaults(**config), _lmcache_metadata("bench/model"), dtype
    )


def _interleaved(
    calls: dict[str, Callable[[int], Any]], n: int, expected: torch.Tensor | None = None
) -> dict[str, tuple[list[float], int]]:
    """``_timed`` for several engines at once: call i of each runs back to back,
    in an order that flips every iteration, so drifting machine load and
    position effects fall on all engines alike."""
    results: dict[str, tuple[list[float], int]] = {name: ([], 0) for name in calls}
    names = list(calls)
    for i in range(n):
        for name in names if i % 2 == 0 else reversed(names):
            times, hits = _timed(lambda _, call=calls[name], i=i: call(i), 1, expected)
            previous_times, previous_hits = results[name]
            results[name] = (previous_times + times, previous_hits + hits)
    return results


def _bench_pair(
    tensor: torch.Tensor, n: int, ours_config: dict[str, Any], up_config: dict[str, Any]
) -> tuple[list, list[str]]:
    """Both engines on identical tiers (separate directories), measured interleaved."""
    from ..engine import ECCache

    shape, dtype = tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")
    hashes = [f"bench-{shape}-{dtype}-{i}" for i in range(n)]
    cold = [f"cold-{h}" for h in hashes]
    rows: list[dict[str, Any]] = []

    def add(tier: str, op: str, results: dict, notes: dict[str, str] | None = None) -> None:
        for engine, (times, hits) in results.items():
            note = (notes or {}).get(engine, "")
            rows.append(_row(tier, op, engine, shape, dtype, times, hits, note))

    cache = ECCache.from_config(ours_config, model="bench/model", dtype=tensor.dtype)
    engine = _upstream(up_config, tensor.dtype)
    manager = engine._storage_manager
    up_key = engine._make_cache_key
    try:
        results = _interleaved(
            {
                OURS: lambda i: cache.put(cold[i], tensor),
                UPSTREAM: lambda i: engine.put(cold[i], tensor),
            },
            n,
        )
        add(
            "cpu",
            "put",
            {k: (t, None) for k, (t, _) in results.items()},
            {OURS: COLD_NOTE, UPSTREAM: COLD_NOTE},
        )
        cache.flush()
        _wait_upstream_disk(engine)
        for h in cold:
            cache.remove(h)
            manager.remove(up_key(h))
        results = _interleaved(
            {
                OURS: lambda i: cache.put(hashes[i], tensor),
                UPSTREAM: lambda i: engine.put(hashes[i], tensor),
            },
            n,
        )
        add("cpu", "put (warm pool)", {k: (t, None) for k, (t, _) in results.items()})
        cache.flush()
        _wait_upstream_disk(engine)
        add(
            "cpu",
            "get",
            _interleaved(
                {
                    OURS: lambda i: cache.get(hashes[i]),
                    UPSTREAM: lambda i: engine.get(hashes[i], "cpu"),
                },
                n,
                tensor,
            ),
        )
        upstream_cpu = manager.storage_backends["LocalCPUBackend"]
        for h in hashes:
            cache._cpu.remove(cache.key(h), force=True)
            upstream_cpu.remove(up_key(h), force=True)

        def walk(i: int) -> Any:
            memory_obj = manager.get(up_key(hashes[i]))
            if memory_obj is None:
                return None
            try:
                return memory_obj.tensor.view(tensor.dtype).view(tensor.shape).clone()
            finally:
                memory_obj.ref_count_down()

        # Upstream's get() first: it misses and promotes nothing. Then lmcache-ec
        # against upstream's tier walk; both promote, so each entry is read once.
        add(
            "disk",
            "get",
            {UPSTREAM: _timed(lambda i: engine.get(hashes[i], "cpu"), n, tensor)},
            {UPSTREAM: "get() reads only the CPU tier"},
        )
        add(
            "disk",
            "get",
            _interleaved({OURS: lambda i: cache.get(hashes[i]), UPSTREAM_WALK: walk}, n, tensor),
            {OURS: "CPU copies dropped", UPSTREAM_WALK: "tier walk, promotes to CPU"},
        )
        paths = [cache._disk._key_to_path(cache.key(h)) for h in hashes]
    finally:
        cache.close()
        engine.close()

    cache = ECCache.from_config(ours_config, model="bench/model", dtype=tensor.dtype)
    engine = _upstream(up_config, tensor.dtype)
    try:
        add(
            "disk",
            "get after restart",
            _interleaved(
                {
                    OURS: lambda i: cache.get(hashes[i]),
                    UPSTREAM: lambda i: engine.get(hashes[i], "cpu"),
                },
                n,
                tensor,
            ),
            {OURS: "new engine, same directory", UPSTREAM: "disk index starts empty"},
        )
    finally:
        cache.close()
        engine.close()
    return rows, paths


def _floors(tensor: torch.Tensor, n: int, paths: list[str]) -> list:
    shape, dtype = tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")
    times, _ = _timed(lambda i: tensor.clone(), n)
    rows = [_row("cpu", "get", FLOOR, shape, dtype, times, note="tensor.clone()")]
    existing = [p for p in paths if os.path.exists(p)]
    if existing:
        size = os.path.getsize(existing[0])

        def read(i: int) -> int:
            buffer = torch.empty(size, dtype=torch.uint8)
            with open(existing[i % len(existing)], "rb") as stream:
                return stream.readinto(buffer.numpy())

        times, _ = _timed(read, n)
        rows.append(
            _row(
                "disk",
                "get",
                FLOOR,
                shape,
                dtype,
                times,
                note="readinto of the same bytes (page cache)",
            )
        )
    return rows


_STARTUP = r"""
import json, os, sys, time, torch
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
which, config = sys.argv[1], json.loads(sys.argv[2])
from lmcache_ec.bench.local import _upstream
from lmcache_ec.engine import ECCache
before = rss(); started = time.perf_counter()
if which == "ours":
    engine = ECCache.from_config(config, model="bench/model")
else:
    engine = _upstream(config, torch.bfloat16)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "rss_bytes": rss() - before}))
engine.close()
"""


def measure_startup(which: str, config: dict[str, Any]) -> dict[str, Any]:
    """Construction time and RSS growth of one engine, in a fresh process."""
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


def run_local(settings: LocalBenchSettings) -> dict[str, Any]:
    """Run every measurement; return ``{"settings", "rows", "ratios", "startup"}``."""
    rows: list[dict[str, Any]] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        return _run(settings, rows)
    finally:
        torch.set_num_threads(threads)


def _run(settings: LocalBenchSettings, rows: list[dict[str, Any]]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lmcache-ec-bench-", dir=settings.directory) as root:
        for shape in settings.shapes:
            for dtype_name in settings.dtypes:
                dtype = SUPPORTED_DTYPES[dtype_name]
                tensor = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)
                tag = f"{shape[0]}x{shape[1]}-{dtype_name}"
                ours_dir, up_dir = (
                    os.path.join(root, f"ours-{tag}"),
                    os.path.join(root, f"up-{tag}"),
                )
                os.makedirs(ours_dir)
                os.makedirs(up_dir)
                pair, paths = _bench_pair(
                    tensor,
                    settings.iterations,
                    _tier_config(ours_dir, settings),
                    _tier_config(up_dir, settings),
                )
                rows += pair
                rows += _floors(tensor, settings.iterations, paths)
        startup: dict[str, Any] = {}
        if settings.startup:
            config = {
                "local_cpu": True,
                "max_local_cpu_size": settings.startup_cpu_gb,
                "local_disk": os.path.join(root, "startup"),
                "max_local_disk_size": 1.0,
            }
            os.makedirs(config["local_disk"])
            startup = {
                "cpu_gb": settings.startup_cpu_gb,
                OURS: measure_startup("ours", config),
                UPSTREAM: measure_startup("upstream", config),
            }
    return {
        "settings": {**asdict(settings), "directory": settings.directory},
        "rows": rows,
        "ratios": ratios(rows),
        "startup": startup,
    }


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (shape, dtype, tier, op): speed-up over upstream and fraction of the floor."""
    index = {(r["engine"], r["tier"], r["op"], tuple(r["shape"]), r["dtype"]): r for r in rows}
    out = []
    for (engine, tier, op, shape, dtype), ours in index.items():
        if engine != OURS:
            continue
        entry: dict[str, Any] = {
            "tier": tier,
            "op": op,
            "shape": list(shape),
            "dtype": dtype,
            "ours_ms": ours["median_ms"],
            "ours_hits": ours["hits"],
        }
        for name, label in (
            (UPSTREAM, "upstream"),
            (UPSTREAM_WALK, "upstream_walk"),
            (FLOOR, "floor"),
        ):
            other = index.get((name, tier, op, shape, dtype))
            if other is None or not ours["median_ms"]:
                continue
            entry[f"{label}_ms"] = other["median_ms"]
            entry[f"{label}_hits"] = other["hits"]
            # >1: ours is faster than upstream; for the floor, the fraction of it reached.
            entry[f"vs_{label}"] = other["median_ms"] / ours["median_ms"]
        out.append(entry)
    return out
