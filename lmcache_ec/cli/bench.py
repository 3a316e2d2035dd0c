"""``bench``: measurements with a baseline in the same run (see ``lmcache_ec.bench``)."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from .common import console, fail

bench_app = typer.Typer(help="Benchmarks: ours next to a baseline, same run.", no_args_is_help=True)


def _shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for part in text.split(","):
        try:
            rows, cols = (int(v) for v in part.lower().split("x"))
        except ValueError:
            fail(f"invalid shape {part!r}: use e.g. 256x2560,1024x2048", 2)
        if rows < 1 or cols < 1:
            fail(f"invalid shape {part!r}: dimensions must be >= 1", 2)
        shapes.append((rows, cols))
    return shapes


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


@bench_app.command("local")
def local(
    shapes: Annotated[str, typer.Option(help="Comma-separated ROWSxCOLS.")] = "256x2560",
    dtypes: Annotated[
        str, typer.Option(help="Comma-separated: bfloat16, float16, float32.")
    ] = "bfloat16",
    iterations: Annotated[int, typer.Option(help="Entries per measurement.")] = 100,
    cpu_gb: Annotated[float, typer.Option(help="CPU tier size of both engines (GB).")] = 1.0,
    startup_cpu_gb: Annotated[
        float, typer.Option(help="CPU tier size for the start-up measurement (GB).")
    ] = 2.0,
    startup: Annotated[bool, typer.Option(help="Measure start-up time and RSS.")] = True,
    threads: Annotated[
        int, typer.Option(help="torch intra-op threads during the run (same for every engine).")
    ] = 1,
    directory: Annotated[
        str | None, typer.Option(help="Where the temporary disk tiers go (default: $TMPDIR).")
    ] = None,
    json_path: Annotated[
        str | None, typer.Option("--json", help="Also write the results to this JSON file.")
    ] = None,
) -> None:
    """Put/get latency on the CPU and disk tiers: lmcache-ec vs LMCache's ECCacheEngine."""
    from ..bench.local import LocalBenchSettings, run_local
    from ..key import SUPPORTED_DTYPES

    names = [d.strip() for d in dtypes.split(",") if d.strip()]
    for name in names:
        if name not in SUPPORTED_DTYPES:
            fail(f"unsupported dtype {name!r}; use {', '.join(SUPPORTED_DTYPES)}", 2)
    if iterations < 1:
        fail("--iterations must be >= 1", 2)
    settings = LocalBenchSettings(
        shapes=_shapes(shapes),
        dtypes=names,
        iterations=iterations,
        cpu_gb=cpu_gb,
        startup_cpu_gb=startup_cpu_gb,
        startup=startup,
        threads=threads,
        directory=directory,
    )
    needed = max(r * c for r, c in settings.shapes) * 4 * iterations * 1.2
    if needed > cpu_gb * 1024**3:
        fail(f"--cpu-gb {cpu_gb} cannot hold {iterations} entries of the largest shape", 2)
    with console.status("benchmarking local tiers…"):
        result = run_local(settings)
    print_local(result)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
        console.print(f"wrote {json_path}")


SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
LEGEND = {
    "lmcache-ec": "ours",
    "ECCacheEngine": "upstream",
    "ECCacheEngine (StorageManager.get)": "upstream walk",
    "floor": "floor",
}


def print_local(result: dict[str, Any]) -> None:
    notes: dict[str, int] = {}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in result["rows"]:
        groups.setdefault(("x".join(map(str, row["shape"])), row["dtype"]), []).append(row)
    for (shape, dtype), rows in groups.items():
        table = Table(title=f"{shape} {dtype}: ms per op")
        for column in ("tier", "op", "engine", "median", "p99", "hits"):
            table.add_column(
                column, justify="left" if column in ("tier", "op", "engine") else "right"
            )
        for row in rows:
            hits = "" if row["hits"] is None else f"{row['hits']}/{row['n']}"
            mark = ""
            if row["note"]:
                mark = f" [{notes.setdefault(row['note'], len(notes) + 1)}]"
            table.add_row(
                row["tier"],
                row["op"],
                LEGEND.get(row["engine"], row["engine"]) + mark,
                _ms(row["median_ms"]),
                _ms(row["p99_ms"]),
                hits,
                style="red" if row["hits"] == 0 else None,
            )
        console.print(table)
    for note, number in notes.items():
        console.print(f"  [{number}] {note}")
    console.print("  ours = lmcache-ec ECCache; upstream = lmcache.v1.ec_engine.ECCacheEngine")
    table = Table(title="Median ratios: >1 means lmcache-ec is faster")
    for column in ("shape", "tier", "op", "ours ms", "vs upstream", "vs upstream walk", "vs floor"):
        table.add_column(column)
    for entry in result["ratios"]:

        def ratio(label: str, entry: dict[str, Any] = entry) -> str:
            if f"vs_{label}" not in entry:
                return "-"
            if entry.get(f"{label}_hits") == 0:
                return "[red]baseline missed[/]"
            return f"{entry[f'vs_{label}']:.2f}x"

        table.add_row(
            "x".join(map(str, entry["shape"])) + " " + SHORT.get(entry["dtype"], entry["dtype"]),
            entry["tier"],
            entry["op"],
            _ms(entry["ours_ms"]),
            ratio("upstream"),
            ratio("upstream_walk"),
            ratio("floor"),
        )
    console.print(table)
    startup = result.get("startup") or {}
    if startup:
        table = Table(title=f"Start-up with a {startup['cpu_gb']} GB CPU tier (fresh process)")
        for column in ("engine", "seconds", "RSS growth"):
            table.add_column(column)
        for engine in ("lmcache-ec", "ECCacheEngine"):
            data = startup.get(engine, {})
            if "error" in data:
                table.add_row(engine, "[red]failed[/]", str(data["error"]))
            else:
                table.add_row(
                    engine, f"{data['seconds']:.3f}", f"{data['rss_bytes'] / 1024**2:.0f} MB"
                )
        console.print(table)


def _lazy(module: str, name: str) -> None:
    """Expose ``lmcache_ec.bench.<module>`` as ``bench <name>`` if it is installed."""
    try:
        spec = importlib.util.find_spec(f"lmcache_ec.bench.{module}")
    except ImportError:
        spec = None
    if spec is None:
        return

    @bench_app.command(
        name, context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
    )
    def command(ctx: typer.Context) -> None:
        target = importlib.import_module(f"lmcache_ec.bench.{module}")
        entry = getattr(target, "cli", None) or getattr(target, "main", None)
        if entry is None:
            fail(f"lmcache_ec.bench.{module} has no cli()/main() entry point", 2)
        params = inspect.signature(entry).parameters
        code = entry(list(ctx.args)) if params else entry()
        raise typer.Exit(int(code or 0))

    command.__doc__ = f"Run lmcache_ec.bench.{module} (its own options follow)."


importlib.import_module("importlib.util")
_lazy("remote", "remote")
_lazy("connector", "connector")
