"""``lmcache-ec bench fleet``: N engine processes sharing one store, one image stream.

Every process (a job process running ``fleet_nodes.run_node``) is vLLM's real ``Scheduler``
with lmcache-ec's scheduler-side connector plus a worker-side connector that
loads and saves (``steps.SimEngine``: the encoder and forward pass are sleeps).
The processes share a remote tier (Redis, or S3 with ``store="s3"``); Redis
also carries their start barrier.

The stream: ``requests`` requests, each with one image drawn from ``images``
distinct images by a Zipf law (exponent ``zipf``), one every ``interval_ms``,
dealt round-robin over the processes; every process waits for its requests'
times on a shared clock. The same stream runs three ways: one process
(the baseline), the fleet with encode claims off, and with them on when the
connector knows ``claim_encodes``.

Reported per run (fleet-wide, and per process):

- ``encodes``: encoder runs; ``encodes_per_unique`` over the distinct images
  the stream holds. ``hits``: requests whose image was not encoded for them
  (a tier load or vLLM's encoder cache); ``hits + encodes == requests``.
- ``tier_hits``: reads answered by each tier (``ECCache.stats``).
- ``bytes``: moved per tier: ``put`` (CPU: frames accepted; remote: uploads
  times the frame size) and ``get`` (hits of that tier times the frame size).
- ``memory``: host copies resident at the end (``ECCache.contains`` of
  every image): the bytes of the per-process CPU-tier copies next to one copy
  each; with ``node_tier`` (all processes run on this machine, as TP ranks or
  co-located engines do) the bytes the shared node tier holds instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from ..remote_names import redact
from .fleet_nodes import BARRIER_TIMEOUT, RUN_TIMEOUT, Progress, stop_run
from .job_protocol import run_in_worker
from .run import LOCAL_S3_BUCKET, LOCAL_S3_CREDENTIALS, machine


@dataclass
class FleetSettings:
    nodes: int = 4
    requests: int = 400
    images: int = 100
    zipf: float = 1.1
    interval_ms: float = 10.0
    encode_ms: float = 30.0
    forward_ms: float = 2.0
    shape: tuple[int, int] = (256, 2560)
    store: str = "redis"  # or "s3"
    claims: str = "auto"  # auto (off, and on when the connector knows them), off, on
    claim_wait_s: float = 1.0
    node_tier: bool = False  # one shared host copy per node instead of one per process
    baseline: bool = True  # also run the stream on one process
    redis_url: str | None = None
    s3_endpoint: str | None = None
    s3_url: str = f"s3://{LOCAL_S3_BUCKET}/fleet"
    s3_region: str | None = None
    seed: int = 0


def claims_supported() -> bool:
    """Whether the connector has the encode-claim settings (``claim_encodes``)."""
    from ..integration.vllm.connector_options import ConnectorSettings

    return "claim_encodes" in {f.name for f in dataclasses.fields(ConnectorSettings)}


def image_stream(settings: FleetSettings) -> list[str]:
    """The image (a content hash) of each request, Zipf-distributed over ranks."""
    import hashlib

    rng = random.Random(settings.seed)
    # A negative power underflows to 0.0 where 1 / rank ** zipf would overflow (zipf 2000).
    weights = [float(rank + 1) ** -settings.zipf for rank in range(settings.images)]
    ranks = rng.choices(range(settings.images), weights=weights, k=settings.requests)
    return [hashlib.sha256(f"fleet-{settings.seed}-{r}".encode()).hexdigest() for r in ranks]


# -- the fleet -----------------------------------------------------------------


@contextlib.contextmanager
def shared_stores(settings: FleetSettings, progress: Progress) -> Iterator[tuple[str, dict, dict]]:
    """(Redis URL, the ``ec:`` remote keys, env for the processes)."""
    from . import servers

    with contextlib.ExitStack() as stack:
        redis_url = settings.redis_url
        if redis_url is None:
            progress("starting redis-server on 127.0.0.1")
            redis_url = stack.enter_context(servers.local_redis())
        env: dict[str, str] = {}
        if settings.store == "s3":
            endpoint = settings.s3_endpoint
            if endpoint is None:
                progress("starting moto's S3 server on 127.0.0.1")
                bucket = settings.s3_url.removeprefix("s3://").split("/", 1)[0]
                endpoint = stack.enter_context(servers.moto_process(bucket))
                env.update(LOCAL_S3_CREDENTIALS)
                # This process too: it removes each run's entries afterwards.
                previous = {k: os.environ.get(k) for k in env}
                os.environ.update(env)
                stack.callback(_restore_environ, previous)
            remote = {
                "remote_url": settings.s3_url,
                "s3_endpoint_url": endpoint,
                "s3_region": settings.s3_region or env.get("AWS_DEFAULT_REGION"),
            }
        else:
            remote = {"remote_url": redis_url}
        yield redis_url, remote, env


def _restore_environ(previous: dict[str, str | None]) -> None:
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _run(
    label: str,
    nodes: int,
    claims: dict[str, Any],
    stream: list[str],
    settings: FleetSettings,
    stores: tuple[str, dict, dict],
    progress: Progress,
) -> dict[str, Any]:
    redis_url, remote, env = stores
    run = f"fleet-{uuid.uuid4().hex[:10]}"
    frame_guess = settings.shape[0] * settings.shape[1] * 2
    ec = {
        "max_local_cpu_size": max(0.1, 2 * settings.images * frame_guess / 1024**3),
        "remote_timeout": 30.0,
        "namespace": run,  # a fresh namespace: nothing carries over between runs
        **remote,
    }
    node_dir = None
    node_users = None
    if settings.node_tier:
        from ..runtime_dirs import state_base
        from ..tiers.node import NodeUsers, node_path

        node_dir = tempfile.mkdtemp(prefix=f"{run}-", dir=state_base())
        ec.update(node_tier=True, node_dir=node_dir, max_node_size=ec["max_local_cpu_size"])
        # Used by this process too, until measured: the last user to leave clears it.
        node_users = NodeUsers(node_path(node_dir, run), lambda: 0)
    job = {
        "job": "fleet-node",
        "run": run,
        "nodes": nodes,
        "stream": stream,
        "ec": ec,
        "claims": claims,
        "shape": list(settings.shape),
        "interval_ms": settings.interval_ms,
        "encode_ms": settings.encode_ms,
        "forward_ms": settings.forward_ms,
        "barrier_url": redis_url,
    }
    results = run_nodes(label, job, nodes, env, progress)
    node_bytes = _node_bytes(node_dir) if node_dir else None
    if node_users is not None:
        node_users.leave()
    if node_dir:
        shutil.rmtree(node_dir, ignore_errors=True)
    remove_entries(ec, {r["storage_prefix"] for r in results if isinstance(r, dict)})
    raise_first_failure(label, results)
    return summarise(label, results, stream, settings.shape, node_bytes)


def run_nodes(
    label: str, job: dict[str, Any], nodes: int, env: dict, progress: Progress
) -> list[Any]:
    """Run ``job`` in ``nodes`` worker processes that start together at the run's
    barrier (Redis ``job["barrier_url"]``); each node's result or exception."""
    redis_url, run = job["barrier_url"], job["run"]
    results: list[Any] = [None] * nodes

    def one(node: int) -> None:
        try:
            found = run_in_worker(
                {**job, "node": node},
                env,
                RUN_TIMEOUT + BARRIER_TIMEOUT,
                lambda t: progress(f"{label}: {t}"),
            )
            results[node] = found[0]
        except Exception as exc:
            results[node] = exc
            stop_run(redis_url, run)  # the others would wait for it at the barrier

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in range(nodes)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:  # interrupted (Ctrl-C, SIGTERM): no process is left running
        stop_run(redis_url, run)
        for thread in threads:
            thread.join(30)
        raise
    finally:
        with contextlib.suppress(Exception):
            import redis

            with redis.Redis.from_url(redis_url) as client:
                client.delete(f"{run}:ready", f"{run}:start", f"{run}:stop")
    return results


def raise_first_failure(label: str, results: list[Any]) -> None:
    """The first node's exception, the cause first: the others then stopped because of it."""
    failed = sorted(
        (r for r in results if isinstance(r, Exception)), key=lambda e: "stopped:" in str(e)
    )
    if failed:
        raise RuntimeError(f"{label}: {failed[0]}")


def _node_bytes(node_dir: str) -> int:
    """Bytes the node tier under ``node_dir`` holds (every namespace)."""
    from ..purge.inventory import directory_usage
    from ..tiers.node import node_dirs

    return sum(directory_usage(d)["bytes"] for d in node_dirs(node_dir))


def remove_entries(ec: dict[str, Any], prefixes: set[str]) -> None:
    """Delete what a run stored in the shared store (a fresh namespace per run)."""
    from ..config import load_config
    from ..remote.catalog import open_catalog

    with contextlib.suppress(Exception):
        catalog = open_catalog(load_config(ec))
        if catalog is not None:
            with catalog:
                for prefix in prefixes:
                    for name, _size in list(catalog.list(prefix)):
                        catalog.delete(name)


def summarise(
    label: str,
    per_node: list[dict[str, Any]],
    stream: list[str],
    shape: tuple[int, int],
    node_bytes: int | None = None,
) -> dict[str, Any]:
    """Fleet-wide totals of the processes' results (see the module docstring)."""
    requests = sum(n["requests"] for n in per_node)
    unique = len(set(stream))
    encodes = sum(n["encodes"] for n in per_node)
    hits = sum(n["hits"] for n in per_node)
    puts = sum(n["puts"] for n in per_node)
    frame = sum(n["put_bytes"] for n in per_node) / puts if puts else shape[0] * shape[1] * 2
    tier_hits: dict[str, int] = {}
    for node in per_node:
        for tier, count in node["tier_hits"].items():
            tier_hits[tier] = tier_hits.get(tier, 0) + count
    uploads = sum(n["uploads"] for n in per_node)
    copies = sum(len(n["cpu_resident"]) for n in per_node)
    resident = {image for n in per_node for image in n["cpu_resident"]}
    put_bytes = {"cpu": sum(n["put_bytes"] for n in per_node), "remote": round(uploads * frame)}
    remote_tier = ("remote",) if uploads or "remote" in tier_hits else ()
    return {
        "label": label,
        "nodes": len(per_node),
        "requests": requests,
        "finished": sum(n["finished"] for n in per_node),
        "unique_images": unique,
        "encodes": encodes,
        "encodes_per_unique": encodes / unique if unique else None,
        "hits": hits,
        "hit_rate": hits / requests if requests else None,
        "tier_hits": tier_hits,
        "frame_bytes": round(frame),
        "bytes": {
            tier: {
                "put": put_bytes.get(tier, 0),
                "get": round(tier_hits.get(tier, 0) * frame),
            }
            for tier in sorted({"cpu", *remote_tier, *tier_hits})
        },
        "memory": {
            "per_process_copies": copies,
            "per_process_bytes": round(copies * frame),
            "one_copy_bytes": round(len(resident) * frame),
            # the shared node tier's files (None without it)
            "node_tier_bytes": node_bytes,
            "node_tier_images": len({i for n in per_node for i in n.get("node_resident", ())}),
        },
        "per_node": per_node,
    }


def run_fleet(
    settings: FleetSettings, progress: Progress = lambda _: None, command: str = ""
) -> dict[str, Any]:
    """Every run ``settings`` asks for, on one stream; the JSON-ready result."""
    started = time.perf_counter()
    if settings.nodes < 1 or settings.requests < 1 or settings.images < 1:
        raise ValueError("nodes, requests and images must be >= 1")
    stream = image_stream(settings)
    supported = claims_supported()
    modes: list[tuple[str, dict[str, Any]]] = []
    off = {"claim_encodes": False} if supported else {}
    on = {"claim_encodes": True, "claim_wait_s": settings.claim_wait_s}
    if settings.claims in ("auto", "off"):
        modes.append(("claims off", off))
    if settings.claims == "on" or (settings.claims == "auto" and supported):
        if not supported:
            raise ValueError("this connector has no claim_encodes setting")
        modes.append(("claims on", on))
    runs: list[dict[str, Any]] = []
    with shared_stores(settings, progress) as stores:
        if settings.baseline:
            runs.append(_run("one process", 1, off, stream, settings, stores, progress))
        for label, claims in modes:
            runs.append(
                _run(
                    f"{settings.nodes} processes, {label}",
                    settings.nodes,
                    claims,
                    stream,
                    settings,
                    stores,
                    progress,
                )
            )
    return fleet_result(
        "lmcache-ec-bench-fleet/1",
        command,
        {
            **asdict(settings),
            "shape": list(settings.shape),
            "redis_url": redact(settings.redis_url) or None,
        },
        runs,
        runs[0] if settings.baseline else None,
        started,
        claims_supported=supported,
    )


def fleet_result(
    schema: str,
    command: str,
    settings: dict[str, Any],
    runs: list[dict[str, Any]],
    single: dict[str, Any] | None,
    started: float,
    **extra: Any,
) -> dict[str, Any]:
    """The JSON-ready result; each run's hit rate also as a ratio to ``single``'s."""
    for run in runs:
        run["hit_rate_vs_one_process"] = (
            run["hit_rate"] / single["hit_rate"] if single and single["hit_rate"] else None
        )
    return {
        "schema": schema,
        "command": command,
        "machine": machine(),
        "settings": settings,
        **extra,
        "runs": runs,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
