"""Redis and S3 tiers: lmcache-ec next to upstream and the bare client, same bytes.

``ECCache`` runs with ``local_cpu: false`` and no disk tier, so its CPU pool
only stages transfers and every ``get`` is answered by the store. Rows:

  ``put``                time for the call to return, next to the same put on a
                         CPU-only ``ECCache`` (``cpu_only``); ``in_flight`` counts
                         the puts whose upload was still running when they returned.
  ``put (until stored)`` until the store has the entry (existence check + upload).
  ``get``, ``get_many``  reads from the store (lookup, transfer, checksum, copy out).

Baselines: upstream ``ECCacheEngine`` on the same Redis config (its ``get()``
reads only the CPU tier, which is empty here, so its ``StorageManager.get``
tier walk is timed; its upload end is observed with ``EXISTS``). Upstream
cannot use S3 here (see ``S3_UPSTREAM``). Limit: redis-py ``GET``/``SET``,
boto3 ``get_object``/``put_object`` of the frame ``ECCache`` stored.
Entries go to a fresh namespace, deleted afterwards with the raw keys.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import Any

import torch

from .local_tiers import ours_put_columns, upstream_own_get
from .measure import alternate, interleave, not_available, summary, wait_until
from .private_access import upstream_drop_cpu, upstream_remote_names, upstream_walk
from .rows import OURS, make_row, pool_gb, sample_tensors
from .subjects import (
    PutTimes,
    RawRedis,
    RawS3,
    batch_note,
    close_bounded,
    open_ours,
    open_upstream,
    same,
    warm_pool,
)

UP, LIMIT = "upstream", "limit"
UP_LABEL = "ECCacheEngine"
S3_UPSTREAM = (
    "LMCache 0.5.6's s3:// connector sizes every transfer from the KV chunk shape "
    "and has no endpoint option: it cannot carry encoder tensors or reach this store"
)

Progress = Callable[[str], None]


def run_remote(
    kind: str,
    shape: tuple[int, int],
    dtype: torch.dtype,
    n: int,
    batch: int,
    progress: Progress,
    *,
    url: str,
    endpoint_url: str | None = None,
    region: str | None = None,
) -> list[dict[str, Any]]:
    """Rows for ``kind`` (``redis`` with a redis:// URL, ``s3`` with s3://bucket/prefix)."""
    tensors = sample_tensors(shape, dtype)
    nbytes = tensors[0].numel() * tensors[0].element_size()

    def x(i: int) -> torch.Tensor:
        return tensors[i % len(tensors)]

    namespace = f"bench-{uuid.uuid4().hex[:12]}"
    staging = pool_gb(batch + 4, nbytes)
    config: dict[str, Any] = {
        "local_cpu": False,  # the pool only stages: every get is a remote read
        "max_local_cpu_size": staging,
        "remote_url": url,
        "remote_timeout": 60.0,
        "namespace": namespace,
    }
    if kind == "s3":
        config.update(s3_endpoint_url=endpoint_url, s3_region=region)
        raw: RawRedis | RawS3 = RawS3(url, endpoint_url, region)
    else:
        raw = RawRedis(url)
    hashes = [f"{kind}-{i}" for i in range(n)]
    ours = open_ours(config, dtype)
    ours_cpu = open_ours({"local_cpu": True, "max_local_cpu_size": staging}, dtype)
    upstream = None
    if kind == "redis":
        # Upstream's tier walk keeps a copy of each entry it reads in its CPU pool,
        # even with local_cpu: false; with a full pool its next remote read waits
        # for memory forever. Its pool therefore holds every entry of the run.
        upstream = open_upstream(
            {
                "local_cpu": False,
                "max_local_cpu_size": pool_gb(n + batch + 8, nbytes),
                "remote_url": url,
            },
            dtype,
        )
    rows: list[dict[str, Any]] = []
    try:
        if ours.tiers[-1] != "remote":
            raise RuntimeError(f"no remote tier in {ours.tiers}")
        frame = _warm_up(ours, upstream, raw, x(0))
        warm_pool(ours_cpu, x(0), 4)
        names = [ours.key(h).storage_name for h in hashes]

        progress("put")
        times = _puts(ours, ours_cpu, upstream, raw, hashes, frame, x)
        ours_cpu.close()
        in_flight = times.pop("in_flight")
        for op, key in (("put", "returns"), ("put (until stored)", "stored")):
            if upstream is None:
                up = not_available(UP_LABEL, S3_UPSTREAM)
            else:
                note = "" if key == "returns" else "upload end seen by polling EXISTS"
                up = summary(UP_LABEL + ".put", times[f"up_{key}"], nbytes, note=note)
            rows.append(
                make_row(
                    kind,
                    op,
                    shape,
                    dtype,
                    nbytes,
                    **ours_put_columns(times, key, in_flight, nbytes),
                    upstream=up,
                    limit=summary(raw.label_write, times["limit"], nbytes, note="the frame bytes"),
                )
            )

        up_note = "" if upstream is None else upstream_own_get(upstream, hashes, x)[1]
        for op, per in (("get", 1), ("get_many", batch)):
            progress(op)
            if upstream is not None:
                upstream_drop_cpu(upstream, hashes)
            steps = [list(range(j, j + per)) for j in range(0, n - per + 1, per)]
            calls = _read_calls(ours, upstream, raw, hashes, names, steps, x)

            def check(j: int, out: Any, steps: list[list[int]] = steps) -> int:
                outs = out if isinstance(out, list) else [out]
                return sum(same(o, x(i)) for o, i in zip(outs, steps[j], strict=True))

            before = ours.stats.snapshot()["hits"]
            series = interleave(calls, len(steps), check=check, checked=(OURS, UP))
            after = ours.stats.snapshot()["hits"]
            # Which tier answered: a read served from anywhere but the store would show.
            tier_hits = {t: c - before.get(t, 0) for t, c in after.items() if c - before.get(t, 0)}
            label = "ECCache.get" if per == 1 else "ECCache.get_many"
            row = make_row(
                kind,
                op,
                shape,
                dtype,
                nbytes,
                ours=summary(
                    label,
                    series[OURS].times,
                    nbytes,
                    per_call_items=per,
                    hits=series[OURS].hits,
                    tier_hits=tier_hits,
                    note="" if per == 1 else batch_note(ours),
                ),
                upstream=(
                    not_available(UP_LABEL, S3_UPSTREAM)
                    if upstream is None
                    else summary(
                        "ECCacheEngine (StorageManager.get)",
                        series[UP].times,
                        nbytes,
                        per_call_items=per,
                        hits=series[UP].hits,
                        note=up_note if per == 1 else "a StorageManager.get per item",
                    )
                ),
                limit=summary(
                    raw.label_read,
                    series[LIMIT].times,
                    nbytes,
                    per_call_items=per,
                    note="the frame ECCache stored" + (", one call per item" if per > 1 else ""),
                ),
            )
            row["batch"] = per
            rows.append(row)
    finally:
        ours_cpu.close()
        _cleanup(ours, upstream, raw, hashes)
    return rows


def _read_calls(
    ours: Any,
    upstream: Any,
    raw: RawRedis | RawS3,
    hashes: list[str],
    names: list[str],
    steps: list[list[int]],
    x: Callable[[int], torch.Tensor],
) -> dict[str, Callable[[int], Any]]:
    """Step j reads the items ``steps[j]``: one ``get``, or one ``get_many`` of several."""

    def ours_read(j: int) -> Any:
        if len(steps[j]) == 1:
            return ours.get(hashes[steps[j][0]])
        return ours.get_many([hashes[i] for i in steps[j]])

    calls: dict[str, Callable[[int], Any]] = {
        OURS: ours_read,
        LIMIT: lambda j: [raw.read(names[i]) for i in steps[j]],
    }
    if upstream is not None:
        calls[UP] = lambda j: [upstream_walk(upstream, hashes[i], x(i)) for i in steps[j]]
    return calls


def _warm_up(ours: Any, upstream: Any, raw: RawRedis | RawS3, tensor: torch.Tensor) -> bytes:
    """Unmeasured first calls (connections, imports); returns a frame's bytes."""
    for name in ("warm-0", "warm-1"):
        if not ours.put(name, tensor) or not ours.flush(60):
            raise RuntimeError("the remote store did not take an entry")
        if upstream is not None:
            upstream.put(name, tensor)
    frame = raw.read(ours.key("warm-0").storage_name)
    if not frame:
        raise RuntimeError("the entry ECCache stored is not where the raw client looks")
    raw.write("warm-raw", frame)
    for name in ("warm-0", "warm-1"):
        ours.get(name)
        if upstream is not None:
            _wait_upstream_stored(upstream, raw, name)
            upstream_walk(upstream, name, tensor)
    return frame


def _wait_upstream_stored(upstream: Any, raw: Any, mm_hash: str) -> bool:
    names = upstream_remote_names(upstream, mm_hash)
    return wait_until(lambda: raw.client.exists(*names) >= len(names), 60, poll_s=0.0002)


def _puts(
    ours: Any,
    ours_cpu: Any,
    upstream: Any,
    raw: RawRedis | RawS3,
    hashes: list[str],
    frame: bytes,
    x: Callable[[int], torch.Tensor],
) -> dict[str, Any]:
    """Puts interleaved; each engine's upload is waited for before the next engine runs."""
    times = PutTimes("limit")

    def cpu_only_put(i: int) -> None:
        times.timed("cpu_only", lambda: ours_cpu.put(hashes[i], x(i)))
        ours_cpu.remove(hashes[i])  # keeps its pool as small and warm as the staging pool

    steps = [
        lambda i: times.ours(ours, hashes[i], x(i)),
        cpu_only_put,
        lambda i: times.timed("limit", lambda: raw.write(f"raw-{i}", frame)),
    ]
    if upstream is not None:
        steps.append(
            lambda i: times.upstream(
                upstream, hashes[i], x(i), lambda: _wait_upstream_stored(upstream, raw, hashes[i])
            )
        )
    alternate(steps, len(hashes))
    return times.result()


def _cleanup(ours: Any, upstream: Any, raw: RawRedis | RawS3, hashes: list[str]) -> None:
    from ..remote.catalog import open_catalog

    with contextlib.suppress(Exception):
        catalog = open_catalog(ours.config)
        if catalog is not None:
            with catalog:
                for name, _size in list(catalog.list(ours.identity.storage_prefix)):
                    catalog.delete(name)
    ours.close()
    raw.cleanup()
    if upstream is not None:
        with contextlib.suppress(Exception):
            for start in range(0, len(hashes), 50):
                names = [
                    name
                    for mm_hash in [*hashes[start : start + 50], "warm-0", "warm-1"]
                    for name in upstream_remote_names(upstream, mm_hash)
                ]
                raw.client.delete(*names)
        close_bounded(upstream, 0.5)
