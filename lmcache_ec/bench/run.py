"""``lmcache-ec bench``: every tier, every baseline, one run, one result.

The parent process only organises: it finds or starts the stores, runs each
measurement job (one tier and shape, the connector paths, start-up) in a
fresh worker process (``lmcache_ec.bench.job_process``), and assembles the rows,
ratios and targets into one JSON-ready dict. A requested tier that cannot be
measured — no server, unreachable, a job that failed — is a ``skipped`` entry
with the reason, never a missing row.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ..remote_names import redact
from . import servers
from .job_protocol import run_in_worker
from .measure import merge_repeats
from .rows import skipped_row
from .targets import CONVENTION, annotate, ratios

SCHEMA = "lmcache-ec-bench/1"
TIERS = ("cpu", "disk", "redis", "s3")
# Encoder outputs of real models: [tokens per image, hidden size].
SHAPES = {
    "Gemma-3": (256, 2560),
    "Gemma-3-27B": (256, 5376),
    "Qwen2.5-VL": (1024, 2048),
}
QUICK_SHAPES = ("Gemma-3",)
LOCAL_S3_BUCKET = "lmcache-ec-bench"
LOCAL_S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}

Progress = Callable[[str], None]


@dataclass
class BenchSettings:
    quick: bool = False
    shapes: list[tuple[int, int]] = field(default_factory=lambda: list(SHAPES.values()))
    dtype: str = "bfloat16"
    iterations: int = 100
    batch: int = 8
    tiers: list[str] = field(default_factory=lambda: list(TIERS))
    redis_url: str | None = None
    s3_url: str = f"s3://{LOCAL_S3_BUCKET}/bench"
    s3_endpoint: str | None = None
    s3_region: str | None = None
    startup: bool = True
    startup_cpu_gb: float = 4.0
    startup_rounds: int = 3
    connector: bool = True
    lookup_items: int = 2000
    threads: int = 1
    directory: str | None = None
    job_timeout: float = 1800.0
    repeat: int = 1  # runs per job, each in a fresh process; rows are their medians

    @classmethod
    def quick_defaults(cls, **overrides: Any) -> BenchSettings:
        """Fewer shapes and iterations: a few minutes on 2 cores, servers included."""
        values: dict[str, Any] = {
            "quick": True,
            "shapes": [SHAPES[name] for name in QUICK_SHAPES],
            "iterations": 20,
            "batch": 4,
            "startup_rounds": 1,
            "lookup_items": 1000,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def shape_name(shape: list[int] | tuple[int, int] | None) -> str:
    if not shape:
        return ""
    for name, known in SHAPES.items():
        if tuple(shape) == known:
            return f"{name} {known[0]}x{known[1]}"
    return f"{shape[0]}x{shape[1]}"


def machine() -> dict[str, Any]:
    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **{name: version(name) for name in ("lmcache-ec", "lmcache", "vllm", "torch", "redis")},
        "hiredis": version("hiredis") is not None,
    }


@dataclass
class _Stores:
    """Where each remote tier is, or why it is not measured."""

    redis_url: str | None = None
    s3_endpoint: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # for the worker processes
    skipped: dict[str, str] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def _stores(settings: BenchSettings, progress: Progress) -> Iterator[_Stores]:
    stores = _Stores()
    with contextlib.ExitStack() as stack:
        if "redis" in settings.tiers:
            if settings.redis_url:
                reason = servers.probe_redis(settings.redis_url)
                if reason:
                    stores.skipped["redis"] = reason
                else:
                    stores.redis_url = settings.redis_url
                    stores.origin["redis"] = "given (--redis-url)"
            elif shutil.which("redis-server") is None:
                stores.skipped["redis"] = "redis-server not found on PATH and no --redis-url"
            else:
                progress("starting redis-server on 127.0.0.1")
                try:
                    stores.redis_url = stack.enter_context(servers.local_redis())
                    stores.origin["redis"] = "redis-server started on 127.0.0.1"
                except Exception as exc:
                    stores.skipped["redis"] = f"redis-server did not start: {exc}"
        if "s3" in settings.tiers:
            if settings.s3_endpoint:
                reason = servers.probe_s3(settings.s3_url, settings.s3_endpoint, settings.s3_region)
                if reason:
                    stores.skipped["s3"] = reason
                else:
                    stores.s3_endpoint = settings.s3_endpoint
                    stores.origin["s3"] = "given (--s3-endpoint)"
            elif reason := servers.moto_missing():
                stores.skipped["s3"] = reason
            else:
                progress("starting moto's S3 server on 127.0.0.1")
                try:
                    bucket = settings.s3_url.removeprefix("s3://").split("/", 1)[0]
                    stores.s3_endpoint = stack.enter_context(servers.moto_process(bucket))
                    stores.env.update(LOCAL_S3_CREDENTIALS)
                    stores.origin["s3"] = "moto S3 server started on 127.0.0.1"
                except Exception as exc:
                    stores.skipped["s3"] = f"moto S3 server did not start: {exc}"
        yield stores


def _jobs(
    settings: BenchSettings, stores: _Stores, root: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    common = {
        "dtype": settings.dtype,
        "iterations": settings.iterations,
        "batch": settings.batch,
        "threads": settings.threads,
        "dir": root,
    }
    for tier in settings.tiers:
        if tier in stores.skipped:
            continue
        for shape in settings.shapes:
            job = {"job": tier, "shape": list(shape), **common}
            if tier == "redis":
                job["url"] = stores.redis_url
            elif tier == "s3":
                job.update(
                    url=settings.s3_url,
                    endpoint_url=stores.s3_endpoint,
                    region=settings.s3_region or stores.env.get("AWS_DEFAULT_REGION"),
                )
            yield tier, job
    if settings.connector:
        remote, note = None, "no remote store reachable: CPU + disk tiers only"
        if stores.redis_url:
            remote, note = {"remote_url": stores.redis_url}, "remote tier: Redis"
        elif stores.s3_endpoint:
            remote = {"remote_url": settings.s3_url, "s3_endpoint_url": stores.s3_endpoint}
            note = "remote tier: S3"
        yield (
            "connector",
            {
                "job": "connector",
                "shape": list(settings.shapes[0]),
                "items": settings.lookup_items,
                "remote": remote,
                "remote_note": note,
                **common,
            },
        )
    if settings.startup and "cpu" in settings.tiers:
        yield (
            "startup",
            {
                "job": "startup",
                "cpu_gb": settings.startup_cpu_gb,
                "rounds": settings.startup_rounds,
                **common,
            },
        )


def run_bench(
    settings: BenchSettings, progress: Progress = lambda _: None, command: str = ""
) -> dict[str, Any]:
    """Measure everything ``settings`` asks for; the JSON-ready result."""
    started = time.perf_counter()
    unknown = sorted(set(settings.tiers) - set(TIERS))
    if unknown:
        raise ValueError(f"unknown tiers {unknown}; choose from {', '.join(TIERS)}")
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    vllm_missing = importlib.util.find_spec("vllm") is None
    # Every job's files go under one directory, removed at the end even when a
    # job was killed (a killed worker cannot clean up after itself).
    root = tempfile.mkdtemp(prefix="lmcache-ec-bench-", dir=settings.directory)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        stores = cleanup.enter_context(_stores(settings, progress))
        for tier, reason in stores.skipped.items():
            skipped.append(skipped_row(tier, reason))
        for label, job in _jobs(settings, stores, root):
            what = f"{label} {shape_name(job.get('shape'))}".strip()
            if vllm_missing and label in ("disk", "connector"):
                reason = "vLLM is not installed (pip install 'lmcache-ec[vllm]')"
                skipped.append({**skipped_row(label, reason), "shape": job.get("shape")})
                continue

            def report(text: str, what: str = what) -> None:
                progress(f"{what}: {text}")

            report("starting")
            try:
                runs = []
                for run in range(settings.repeat):
                    if settings.repeat > 1:
                        report(f"run {run + 1} of {settings.repeat}")
                    runs.append(run_in_worker(job, stores.env, settings.job_timeout, report))
                rows += merge_repeats(runs, ratios)
            except Exception as exc:
                tier = "scheduler" if label == "connector" else label
                tier = "cpu" if label == "startup" else tier
                skipped.append(
                    {**skipped_row(tier, f"{label} job failed: {exc}"), "shape": job.get("shape")}
                )
    targets = annotate(rows)
    status = {}
    for tier in settings.tiers:
        reasons = [s["skipped"] for s in skipped if s["tier"] == tier]
        measured = any(r["tier"] == tier for r in rows)
        status[tier] = {
            "status": "measured" if measured else "skipped",
            "reason": "; ".join(reasons) or None,
            "store": stores.origin.get(tier),
        }
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine(),
        "settings": {
            **asdict(settings),
            "shapes": [list(s) for s in settings.shapes],
            "redis_url": redact(settings.redis_url) or None,
        },
        "convention": CONVENTION,
        "tiers": status,
        "rows": rows,
        "skipped": skipped,
        "targets": targets,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
