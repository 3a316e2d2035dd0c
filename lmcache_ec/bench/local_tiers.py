"""CPU and disk tiers: lmcache-ec next to upstream, vLLM's example connector and the OS.

One call measures one tensor shape on one tier and returns table rows
(``row`` dicts, see ``lmcache_ec.bench.rows``). Every row holds ``ours`` and,
where they apply, ``upstream`` (LMCache's ``ECCacheEngine`` on the same tier
config), ``example`` (vLLM's ``ECExampleConnector``) and ``limit`` (the same
bytes moved by ``torch``/the OS). Engines run interleaved (``measure.interleave``).

CPU tier (``local_cpu`` only):
  ``put (cold pool)``  first use of pool memory: upstream zero-filled its pool
                       at start, lmcache-ec touches pages on first use.
  ``put``              into pool memory used before (steady state).
  ``get``, ``get_many`` limit: ``tensor.clone()`` of a copy of the same tensor
                       made for that entry alone, so it is as cold in the
                       caches as the pool's entry (a sample tensor is hot:
                       the run's check has just read it). ``get`` also times
                       LMCache's CPU backend alone (``cpu_read``: lookup, one
                       copy, release), the floor of a read through it.

Disk tier (CPU + disk, reads with the CPU tier cold):
  ``put``              time for the call to return, next to the same put on a
                       CPU-only ``ECCache`` (``cpu_only``): the difference is what
                       the disk write adds to the caller. ``in_flight`` counts the
                       puts whose disk write was still running when they returned.
  ``put (until stored)`` until the file is written. Example: its synchronous save.
  ``get``, ``get_many`` CPU copies dropped first. Upstream's ``get()`` reads only
                       the CPU tier (it misses here, its hits are noted); its
                       ``StorageManager.get`` tier walk is timed instead.
                       Limit: ``readinto`` of the entry's file (page cache).
                       ``get`` also times ours, the example and the verifying
                       read with one pass over each result (``*_read_once``):
                       the example's tensor maps the file and reads it only then.
  ``get (restarted)``  a new engine on the same directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from .measure import Series, alternate, interleave, summary, wait_until
from .private_access import (
    upstream_cpu_read,
    upstream_disk_idle,
    upstream_drop_cpu,
    upstream_remove,
    upstream_walk,
)
from .rows import OURS, make_row, pool_gb, sample_tensors
from .subjects import (
    ExampleConnector,
    PutTimes,
    RawFile,
    batch_note,
    close_bounded,
    cold_cpu,
    disk_path,
    open_ours,
    open_upstream,
    read_once,
    same,
    warm_pool,
)

UP, EX, LIMIT, VERIFIED = "upstream", "example", "limit", "verified"
CPU_READ, OURS_ONCE, EX_ONCE = "cpu_read", "ours_read_once", "example_read_once"
VERIFIED_ONCE = "verified_read_once"
CPU_READ_LABEL = "LocalCPUBackend get_blocking + clone()"
READ_ONCE_NOTE = "xxh3 over the result"
UP_LABEL = "ECCacheEngine"
CPU_ONLY_LABEL = "ECCache.put, CPU tier only"
CPU_ONLY_NOTE = "the same put with no tier below: what the caller would pay anyway"


def ours_put_columns(
    times: dict[str, Any], key: str, in_flight: Any, nbytes: int
) -> dict[str, Any]:
    """The ``ours`` and ``cpu_only`` cells of a put row (``key``: returns | stored)."""
    returns = key == "returns"
    return {
        "ours": summary(
            "ECCache.put", times[f"ours_{key}"], nbytes, in_flight=in_flight if returns else None
        ),
        "cpu_only": (
            summary(CPU_ONLY_LABEL, times["cpu_only"], nbytes, note=CPU_ONLY_NOTE)
            if returns
            else None
        ),
    }


def upstream_own_get(
    upstream: Any, hashes: list[str], x: Callable[[int], torch.Tensor]
) -> tuple[Series, str]:
    """Upstream's own get() of every entry (it reads the CPU tier only, so misses and
    promotes nothing), and the note of the rows that time its tier walk instead."""
    got = interleave(
        {UP: lambda i: upstream.get(hashes[i], "cpu")},
        len(hashes),
        check=lambda i, out: same(out, x(i)),
    )[UP]
    return got, (
        f"ECCacheEngine.get(): {got.hits}/{len(hashes)} hits (reads the CPU tier only); "
        "timed: its StorageManager.get tier walk"
    )


WALK_LABEL = "ECCacheEngine (StorageManager.get)"
APART_NOTE = "each entry's own copy of its tensor, as cold in cache as the pool's"

Progress = Callable[[str], None]


def run_cpu(
    shape: tuple[int, int], dtype: torch.dtype, n: int, batch: int, progress: Progress
) -> list[dict[str, Any]]:
    tensors = sample_tensors(shape, dtype)
    nbytes = tensors[0].numel() * tensors[0].element_size()
    config = {"local_cpu": True, "max_local_cpu_size": pool_gb(n, nbytes)}
    hashes = [f"cpu-{i}" for i in range(n)]
    cold = [f"cpu-cold-{i}" for i in range(n)]

    def x(i: int) -> torch.Tensor:
        return tensors[i % len(tensors)]

    # One tensor per entry, like the pool's frames: the reads' limit.
    apart = [x(i).clone() for i in range(n)]
    rows: list[dict[str, Any]] = []

    labels = {OURS: "ECCache", UP: UP_LABEL, LIMIT: "tensor.clone()", CPU_READ: CPU_READ_LABEL}

    def add(op: str, series: dict, per_call_items: int = 1, notes: dict | None = None) -> None:
        notes = notes or {}
        measured = {
            name: summary(
                labels[name],
                series[name].times,
                nbytes,
                per_call_items=per_call_items,
                hits=series[name].hits,
                note=notes.get(name, ""),
            )
            for name in series
        }
        rows.append(make_row("cpu", op, shape, dtype, nbytes, **measured))

    ours = open_ours(config, dtype)
    upstream = open_upstream(config, dtype)
    try:
        progress("put, cold pool")
        add(
            "put (cold pool)",
            interleave(
                {
                    OURS: lambda i: ours.put(cold[i], x(i)),
                    UP: lambda i: upstream.put(cold[i], x(i)),
                    LIMIT: lambda i: x(i).clone(),
                },
                n,
            ),
            notes={UP: "pool zero-filled at start-up", OURS: "pool pages touched on first use"},
        )
        for mm_hash in cold:
            ours.remove(mm_hash)
            upstream_remove(upstream, mm_hash)
        progress("put")
        add(
            "put",
            interleave(
                {
                    OURS: lambda i: ours.put(hashes[i], x(i)),
                    UP: lambda i: upstream.put(hashes[i], x(i)),
                    LIMIT: lambda i: x(i).clone(),
                },
                n,
            ),
        )
        progress("get")
        add(
            "get",
            interleave(
                {
                    OURS: lambda i: ours.get(hashes[i]),
                    UP: lambda i: upstream.get(hashes[i], "cpu"),
                    LIMIT: lambda i: apart[i].clone(),
                    CPU_READ: lambda i: upstream_cpu_read(upstream, hashes[i], x(i)),
                },
                n,
                check=lambda i, out: same(out, x(i)),
                checked=(OURS, UP, CPU_READ),
            ),
            notes={LIMIT: APART_NOTE, CPU_READ: "upstream's pool, the floor of a read through it"},
        )
        progress("get_many")
        batches = [list(range(j, j + batch)) for j in range(0, n - batch + 1, batch)]
        add(
            "get_many",
            interleave(
                {
                    OURS: lambda j: ours.get_many([hashes[i] for i in batches[j]]),
                    UP: lambda j: [upstream.get(hashes[i], "cpu") for i in batches[j]],
                    LIMIT: lambda j: [apart[i].clone() for i in batches[j]],
                },
                len(batches),
                check=lambda j, outs: _right(outs, batches[j], x),
                checked=(OURS, UP),
            ),
            per_call_items=batch,
            notes={UP: "a get() per item", LIMIT: f"a clone() per item; {APART_NOTE}"},
        )
    finally:
        ours.close()
        close_bounded(upstream)
    for row in rows:
        row["batch"] = batch if row["op"] == "get_many" else 1
    return rows


def run_disk(
    shape: tuple[int, int],
    dtype: torch.dtype,
    n: int,
    batch: int,
    workdir: str,
    progress: Progress,
) -> list[dict[str, Any]]:
    tensors = sample_tensors(shape, dtype)
    nbytes = tensors[0].numel() * tensors[0].element_size()
    tokens = shape[0]

    def config(name: str) -> dict[str, Any]:
        directory = os.path.join(workdir, name)
        os.makedirs(directory, exist_ok=True)
        return {
            "local_cpu": True,
            "max_local_cpu_size": pool_gb(n, nbytes),
            "local_disk": directory,
            "max_local_disk_size": max(1.0, 4 * n * nbytes / 1024**3),
        }

    ours_config, up_config = config("ours"), config("upstream")
    hashes = [f"disk-{i}" for i in range(n)]

    def x(i: int) -> torch.Tensor:
        return tensors[i % len(tensors)]

    progress("starting vLLM's ECExampleConnector")
    example = ExampleConnector(os.path.join(workdir, "example"))
    raw = RawFile(os.path.join(workdir, "raw"))
    rows: list[dict[str, Any]] = []
    ours = open_ours(ours_config, dtype)
    ours_cpu = open_ours({"local_cpu": True, "max_local_cpu_size": pool_gb(n, nbytes)}, dtype)
    upstream = open_upstream(up_config, dtype)
    walk_label = WALK_LABEL
    try:
        progress("warming up")
        ours = _warm_up(ours, upstream, example, raw, x(0), tokens)
        warm_pool(ours, x(0), n)
        warm_pool(ours_cpu, x(0), n)
        progress("put")
        puts = _disk_puts(ours, ours_cpu, upstream, example, raw, hashes, x)
        ours_cpu.close()
        in_flight = puts.pop("in_flight")
        for op, key in (("put", "returns"), ("put (until stored)", "stored")):
            rows.append(
                make_row(
                    "disk",
                    op,
                    shape,
                    dtype,
                    nbytes,
                    **ours_put_columns(puts, key, in_flight, nbytes),
                    upstream=summary(UP_LABEL + ".put", puts[f"up_{key}"], nbytes),
                    example=summary(
                        "ECExampleConnector.save_caches",
                        puts["example"],
                        nbytes,
                        note="synchronous",
                    ),
                    limit=summary(RawFile.label_write, puts["limit"], nbytes),
                )
            )
        paths = [disk_path(ours, h) for h in hashes]

        progress("get, CPU tier cold")
        ours = cold_cpu(ours)
        upstream_drop_cpu(upstream, hashes)
        up_get, walk_note = upstream_own_get(upstream, hashes, x)
        series = interleave(
            {
                OURS: lambda i: ours.get(hashes[i]),
                UP: lambda i: upstream_walk(upstream, hashes[i], x(i)),
                EX: lambda i: example.load([hashes[i]], tokens).get(hashes[i]),
                LIMIT: lambda i: RawFile.read(paths[i]),
                VERIFIED: lambda i: RawFile.read_verified(paths[i]),
            },
            n,
            check=lambda i, out: same(out, x(i)),
            checked=(OURS, UP, EX),
        )
        progress("get, each result read once, CPU tier cold")
        ours = cold_cpu(ours)  # the pass above promoted every entry
        series |= interleave(
            {
                OURS_ONCE: lambda i: read_once(ours.get(hashes[i])),
                EX_ONCE: lambda i: read_once(example.load([hashes[i]], tokens).get(hashes[i])),
                VERIFIED_ONCE: lambda i: read_once(RawFile.read_verified(paths[i])),
            },
            n,
            check=lambda i, out: same(out, x(i)),
            checked=(OURS_ONCE, EX_ONCE),
        )
        row = _read_row("get", shape, dtype, nbytes, series, 1, walk_label, walk_note, "one item")
        # Upstream's own get(), apart: the table shows its walk, ``bench local`` both.
        row["upstream_get"] = summary(
            UP_LABEL + ".get", up_get.times, nbytes, hits=up_get.hits, note="CPU tier only"
        )
        rows.append(row)

        progress("get_many, CPU tier cold")
        ours = cold_cpu(ours)
        upstream_drop_cpu(upstream, hashes)
        batches = [list(range(j, j + batch)) for j in range(0, n - batch + 1, batch)]
        series = interleave(
            {
                OURS: lambda j: ours.get_many([hashes[i] for i in batches[j]]),
                UP: lambda j: [upstream_walk(upstream, hashes[i], x(i)) for i in batches[j]],
                EX: lambda j: list(example.load([hashes[i] for i in batches[j]], tokens).values()),
                LIMIT: lambda j: [RawFile.read(paths[i]) for i in batches[j]],
                VERIFIED: lambda j: [RawFile.read_verified(paths[i]) for i in batches[j]],
            },
            len(batches),
            check=lambda j, outs: _right(outs, batches[j], x),
            checked=(OURS, UP, EX),
        )
        rows.append(
            _read_row(
                "get_many",
                shape,
                dtype,
                nbytes,
                series,
                batch,
                walk_label,
                "a StorageManager.get per item",
                f"{batch} items per step",
                ours_note=f"CPU tier cold; {batch_note(ours)}",
            )
        )
    finally:
        ours.close()
        ours_cpu.close()
        close_bounded(upstream)

    progress("get after a restart")
    ours = open_ours(ours_config, dtype)
    upstream = open_upstream(up_config, dtype)
    try:
        series = interleave(
            {
                OURS: lambda i: ours.get(hashes[i]),
                UP: lambda i: upstream.get(hashes[i], "cpu"),
                EX: lambda i: example.load([hashes[i]], tokens).get(hashes[i]),
                LIMIT: lambda i: RawFile.read(paths[i]),
            },
            n,
            check=lambda i, out: same(out, x(i)),
            checked=(OURS, UP, EX),
        )
        rows.append(
            _read_row(
                "get (restarted)",
                shape,
                dtype,
                nbytes,
                series,
                1,
                UP_LABEL,
                "its disk index is in memory only and starts empty",
                "one item",
            )
        )
    finally:
        ours.close()
        close_bounded(upstream)
    return rows


def _right(outs: list[Any], items: list[int], x: Callable[[int], torch.Tensor]) -> int:
    """How many of a batch's results equal the tensors stored under ``items``."""
    return sum(same(out, x(i)) for out, i in zip(outs, items, strict=True))


def _read_row(
    op: str,
    shape: tuple[int, int],
    dtype: torch.dtype,
    nbytes: int,
    series: dict,
    batch: int,
    up_label: str,
    up_note: str,
    example_note: str,
    ours_note: str = "CPU tier cold",
) -> dict[str, Any]:
    def s(name: str, label: str, note: str = "") -> dict[str, Any]:
        return summary(
            label,
            series[name].times,
            nbytes,
            per_call_items=batch,
            hits=series[name].hits,
            note=note,
        )

    row = make_row(
        "disk",
        op,
        shape,
        dtype,
        nbytes,
        ours=s(OURS, "ECCache.get_many" if batch > 1 else "ECCache.get", ours_note),
        upstream=s(UP, up_label, up_note),
        example=s(EX, "ECExampleConnector.start_load_caches", example_note),
        limit=s(LIMIT, RawFile.label_read, "the entry's own file"),
        verified=s(VERIFIED, RawFile.label_verified) if VERIFIED in series else None,
        **{
            name: s(name, label, READ_ONCE_NOTE)
            for name, label in (
                (OURS_ONCE, "ECCache.get"),
                (EX_ONCE, "ECExampleConnector"),
                (VERIFIED_ONCE, RawFile.label_verified),
            )
            if name in series
        },
    )
    row["batch"] = batch
    return row


def _warm_up(ours: Any, upstream: Any, example: Any, raw: RawFile, tensor: Any, tokens: int) -> Any:
    """One unmeasured round trip each: first-call costs (imports, first files) are not
    data. Returns ``ours`` reopened (its CPU tier emptied)."""
    for name in ("warm-0", "warm-1"):
        ours.put(name, tensor)
        upstream.put(name, tensor)
        example.save(name, tensor)
        raw.write(name, tensor.view(torch.uint8).numpy())
    ours.flush(60)
    wait_until(lambda: upstream_disk_idle(upstream), 60)
    ours = cold_cpu(ours)
    upstream_drop_cpu(upstream, ["warm-0", "warm-1"])
    for name in ("warm-0", "warm-1"):
        ours.get(name)
        upstream_walk(upstream, name, tensor)
        example.load([name], tokens)
        RawFile.read(os.path.join(raw.directory, name))
    return ours


def _disk_puts(
    ours: Any,
    ours_cpu: Any,
    upstream: Any,
    example: ExampleConnector,
    raw: RawFile,
    hashes: list[str],
    x: Callable[[int], torch.Tensor],
) -> dict[str, Any]:
    """Puts interleaved; each engine's write is waited for before the next engine runs."""
    times = PutTimes("example", "limit")
    alternate(
        [
            lambda i: times.ours(ours, hashes[i], x(i)),
            lambda i: times.timed("cpu_only", lambda: ours_cpu.put(hashes[i], x(i))),
            lambda i: times.upstream(
                upstream, hashes[i], x(i), lambda: wait_until(lambda: upstream_disk_idle(upstream))
            ),
            lambda i: times.timed("example", lambda: example.save(hashes[i], x(i))),
            lambda i: times.timed(
                "limit", lambda: raw.write(hashes[i], x(i).view(torch.uint8).numpy())
            ),
        ],
        len(hashes),
    )
    return times.result()
