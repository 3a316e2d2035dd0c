"""The focused subcommands (``bench local``, ``remote``, ``connector``) on the jobs
of ``lmcache-ec bench``: the same measurements, each a fresh worker process
(``worker``), viewed as one flat row per engine and operation::

    {"tier", "op", "engine", "shape", "dtype", "n", "median_ms", "p99_ms",
     "hits", "note", ...}

``engine`` is ``lmcache-ec`` or the baseline's label (``ECCacheEngine``, its
``StorageManager.get`` walk, ``floor``/the raw client). Ratios follow
``targets.CONVENTION``: baseline median / lmcache-ec median (>1: ours faster).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from .job_protocol import run_in_worker
from .startup import measure_startup

OURS = "lmcache-ec"
UPSTREAM = "ECCacheEngine"
UPSTREAM_WALK = "ECCacheEngine (StorageManager.get)"
FLOOR = "floor"
JOB_TIMEOUT = 1800.0
# Single-item operations only: a get_many row's n counts items, not calls.
LOCAL_OPS = {
    ("cpu", "put (cold pool)"): "put",
    ("cpu", "put"): "put (warm pool)",
    ("cpu", "get"): "get",
    ("disk", "put"): "put",
    ("disk", "put (until stored)"): "put (until stored)",
    ("disk", "get"): "get",
    ("disk", "get (restarted)"): "get after restart",
}
REMOTE_OPS = {"get": "get", "put (until stored)": "put (stored)", "put": "put (returns)"}

Progress = Callable[[str], None]


@dataclass
class LocalBenchSettings:
    shapes: list[tuple[int, int]] = field(default_factory=lambda: [(256, 2560)])
    dtypes: list[str] = field(default_factory=lambda: ["bfloat16"])
    iterations: int = 100
    startup_cpu_gb: float = 2.0
    startup: bool = True
    threads: int = 1  # torch intra-op threads in every job
    directory: str | None = None  # default: a temporary directory, removed after


@contextlib.contextmanager
def _workdir(directory: str | None) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="lmcache-ec-bench-", dir=directory) as root:
        yield root


def _flat(row: dict[str, Any], column: str, engine: str, op: str) -> dict[str, Any]:
    measured = row[column]
    return {
        "tier": row["tier"],
        "op": op,
        "engine": engine,
        "shape": row["shape"],
        "dtype": row["dtype"],
        **{k: measured.get(k) for k in ("n", "median_ms", "p99_ms", "hits", "note")},
    }


def _engine(column: str, measured: dict[str, Any]) -> str | None:
    if column == "ours":
        return OURS
    if column == "limit":
        return FLOOR
    if column == "upstream_get":
        return UPSTREAM
    if column == "upstream":
        return UPSTREAM_WALK if "StorageManager.get" in measured["label"] else UPSTREAM
    return None  # example, cpu_only and the references: shown by ``lmcache-ec bench``


def run_local(settings: LocalBenchSettings, progress: Progress = lambda _: None) -> dict[str, Any]:
    """CPU and disk tiers, lmcache-ec vs upstream and the floor;
    ``{"settings", "rows", "ratios", "startup"}``."""
    rows: list[dict[str, Any]] = []
    with _workdir(settings.directory) as root:
        for shape in settings.shapes:
            for dtype in settings.dtypes:
                for tier in ("cpu", "disk"):
                    job = {
                        "job": tier,
                        "shape": list(shape),
                        "dtype": dtype,
                        "iterations": settings.iterations,
                        "batch": 2,
                        "threads": settings.threads,
                        "dir": root,
                    }
                    label = f"{tier} {shape[0]}x{shape[1]} {dtype}"
                    found = run_in_worker(
                        job, {}, JOB_TIMEOUT, lambda t, w=label: progress(f"{w}: {t}")
                    )
                    for row in found:
                        op = LOCAL_OPS.get((row["tier"], row["op"]))
                        if op is None:
                            continue
                        for column in ("ours", "upstream", "upstream_get", "limit"):
                            measured = row.get(column)
                            engine = measured and "na" not in measured and _engine(column, measured)
                            if engine:
                                rows.append(_flat(row, column, engine, op))
        startup: dict[str, Any] = {}
        if settings.startup:
            progress("start-up")
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
        "settings": asdict(settings),
        "rows": rows,
        "ratios": ratios(rows),
        "startup": startup,
    }


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (shape, dtype, tier, op) of ours: baseline median / ours median."""
    index = {(r["engine"], r["tier"], r["op"], tuple(r["shape"]), r["dtype"]): r for r in rows}
    out = []
    for (engine, tier, op, shape, dtype), ours in index.items():
        if engine != OURS or not ours["median_ms"]:
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
            if other is not None and other["median_ms"]:
                entry[f"{label}_ms"] = other["median_ms"]
                entry[f"{label}_hits"] = other["hits"]
                entry[f"vs_{label}"] = other["median_ms"] / ours["median_ms"]
        out.append(entry)
    return out


def run_remote(
    kind: str,
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    iterations: int = 50,
    env: dict[str, str] | None = None,
    progress: Progress = lambda _: None,
) -> list[dict[str, Any]]:
    """lmcache-ec on one store next to upstream and the raw client (redis-py, boto3).

    ``ratio`` on lmcache-ec's rows: raw client median / ours median (>1: ours
    faster); its ``get`` row's ``hits`` are by the tier that answered, ``verified``
    counts reads equal to the stored tensor.
    """
    job = {
        "job": kind,
        "shape": [256, 2560],
        "dtype": "bfloat16",
        "iterations": iterations,
        "batch": max(1, min(4, iterations)),
        "url": url,
        "endpoint_url": endpoint_url,
        "region": region,
    }
    with _workdir(None) as root:
        found = run_in_worker({**job, "dir": root}, env or {}, JOB_TIMEOUT, progress)
    out: list[dict[str, Any]] = []
    for row in found:
        op = REMOTE_OPS.get(row["op"])
        if op is None:
            continue
        ours = _flat(row, "ours", OURS, op)
        if op == "get":  # hits by the tier that answered; verified: equal to what was put
            ours["verified"], ours["hits"] = ours["hits"], row["ours"].get("tier_hits", {})
        limit = row.get("limit")
        if op != "put (returns)" and limit and limit.get("median_ms") and ours["median_ms"]:
            ours["ratio"] = limit["median_ms"] / ours["median_ms"]
        out.append(ours)
        for column in ("upstream", "limit"):
            measured = row.get(column)
            if op != "put (returns)" and measured and "na" not in measured:
                out.append(_flat(row, column, measured["label"], op))
    return out


def run_connector(model_dir: str, progress: Progress = lambda _: None) -> dict[str, Any]:
    """The connector's scheduler lookups and ``save_caches`` (CPU + disk tiers), µs per
    call and ms per save, next to upstream and vLLM's ``ECExampleConnector``."""
    job = {
        "job": "connector",
        "shape": [256, 2560],
        "dtype": "bfloat16",
        "iterations": 20,
        "items": 1000,
        "remote": None,
        "remote_note": "CPU + disk tiers",
        "model_dir": model_dir,
    }
    with _workdir(None) as root:
        found = run_in_worker({**job, "dir": root}, {}, JOB_TIMEOUT, progress)
    result: dict[str, Any] = {"has_cache_item_us": {}, "save_caches_ms": {}}
    for row in found:
        for column in ("ours", "upstream", "example"):
            measured = row.get(column)
            if not measured or measured.get("median_ms") is None:
                continue
            if row["tier"] == "scheduler":
                name = row["op"].removeprefix("has_cache_item, ")
                name = name if column == "ours" else f"{name}, {measured['label']}"
                result["has_cache_item_us"][name] = round(1000 * measured["median_ms"], 3)
            else:
                name = "return" if column == "ours" else measured["label"]
                result["save_caches_ms"][name] = round(measured["median_ms"], 4)
    return result
