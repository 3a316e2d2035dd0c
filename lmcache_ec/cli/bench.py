"""``bench``: measurements with a baseline in the same run (see ``lmcache_ec.bench``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from .common import console, fail, run_with_status, write_report

bench_app = typer.Typer(
    help="Benchmarks: lmcache-ec next to its baselines and the hardware, same run. "
    "Without a subcommand: every tier, every baseline, one table (see docs/benchmarks.md).",
    no_args_is_help=False,
)


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


@bench_app.callback(invoke_without_command=True)
def bench_all(
    ctx: typer.Context,
    quick: Annotated[
        bool, typer.Option("--quick", help="One shape, fewer iterations: a few minutes.")
    ] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the full result (JSON) here.")
    ] = None,
    chart: Annotated[
        Path | None,
        typer.Option(help="PNG chart path (default: next to --json, else ./bench.png)."),
    ] = None,
    no_chart: Annotated[bool, typer.Option("--no-chart", help="Do not draw the chart.")] = False,
    markdown: Annotated[
        Path | None, typer.Option(help="Also write the table as Markdown here.")
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option(help="Use this Redis (default: start a redis-server on 127.0.0.1)."),
    ] = None,
    s3_endpoint: Annotated[
        str | None,
        typer.Option(help="Use this S3-compatible endpoint (default: start moto on 127.0.0.1)."),
    ] = None,
    s3_url: Annotated[
        str, typer.Option(help="Bucket and prefix for the S3 tier.")
    ] = "s3://lmcache-ec-bench/bench",
    s3_region: Annotated[str | None, typer.Option(help="Region of --s3-endpoint.")] = None,
    shapes: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated ROWSxCOLS (default: 256x2560,256x5376,1024x2048; "
            "--quick: 256x2560)."
        ),
    ] = None,
    tiers: Annotated[str, typer.Option(help="Comma-separated subset of cpu,disk,redis,s3.")] = (
        "cpu,disk,redis,s3"
    ),
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32.")] = "bfloat16",
    iterations: Annotated[
        int | None, typer.Option(min=2, help="Entries per measurement (default 100; --quick 20).")
    ] = None,
    batch: Annotated[
        int | None, typer.Option(min=2, help="Items per get_many call (default 8; --quick 4).")
    ] = None,
    startup: Annotated[bool, typer.Option(help="Measure start-up with a large CPU tier.")] = True,
    startup_cpu_gb: Annotated[
        float, typer.Option(help="CPU tier size for the start-up measurement (GB).")
    ] = 4.0,
    connector: Annotated[
        bool, typer.Option(help="Measure the vLLM connector's has_cache_item and save_caches.")
    ] = True,
    lookup_items: Annotated[
        int | None, typer.Option(min=100, help="Items per scheduler lookup measurement.")
    ] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch intra-op threads in every job.")] = 1,
    directory: Annotated[
        str | None, typer.Option(help="Where temporary tiers go (default: $TMPDIR).")
    ] = None,
) -> None:
    """Every tier (CPU, disk, Redis, S3) and shape against upstream, vLLM's example
    connector and the physical limit; prints one table, writes JSON and a PNG chart."""
    if ctx.invoked_subcommand is not None:
        return

    from ..bench.run import TIERS, BenchSettings, run_bench
    from ..key import SUPPORTED_DTYPES

    chosen = [t.strip() for t in tiers.split(",") if t.strip()]
    for tier in chosen:
        if tier not in TIERS:
            fail(f"unknown tier {tier!r}; choose from {', '.join(TIERS)}", 2)
    if dtype not in SUPPORTED_DTYPES:
        fail(f"unsupported dtype {dtype!r}; use {', '.join(SUPPORTED_DTYPES)}", 2)
    options: dict[str, Any] = {
        "shapes": _shapes(shapes) if shapes else None,
        "iterations": iterations,
        "batch": batch,
        "lookup_items": lookup_items,
    }
    common = {
        "tiers": chosen,
        "dtype": dtype,
        "redis_url": redis_url,
        "s3_url": s3_url,
        "s3_endpoint": s3_endpoint,
        "s3_region": s3_region,
        "startup": startup,
        "startup_cpu_gb": startup_cpu_gb,
        "connector": connector,
        "threads": threads,
        "directory": directory,
    }
    if quick:
        settings = BenchSettings.quick_defaults(**options, **common)
    else:
        settings = BenchSettings(**{k: v for k, v in options.items() if v is not None}, **common)
    if settings.batch > settings.iterations:
        fail("--batch must not exceed --iterations", 2)
    result = run_with_status(
        "lmcache-ec bench", lambda progress, command: run_bench(settings, progress, command)
    )
    from ..bench.report import markdown as to_markdown
    from ..bench.report import print_table

    def draw_chart(result: dict[str, Any], path: str) -> None:
        from ..bench.chart import draw_chart  # matplotlib: ImportError when absent

        draw_chart(result, path)

    write_report(
        result,
        print_table=print_table,
        to_markdown=to_markdown,
        draw_chart=draw_chart,
        json_path=json_path,
        markdown=markdown,
        chart=chart,
        no_chart=no_chart,
        default_chart="bench.png",
    )


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


@bench_app.command()
def remote(
    redis_url: Annotated[
        str | None, typer.Option(help="Measure this Redis (redis://, rediss://).")
    ] = None,
    s3_url: Annotated[str | None, typer.Option(help="Measure this S3 prefix (s3://b/p).")] = None,
    s3_endpoint_url: Annotated[
        str | None, typer.Option(help="Endpoint of an S3-compatible store.")
    ] = None,
    local_servers: Annotated[
        bool,
        typer.Option(help="Start a redis-server and a moto S3 server on 127.0.0.1 and use them."),
    ] = False,
    iterations: Annotated[int, typer.Option(min=1)] = 50,
    as_json: Annotated[Path | None, typer.Option("--json", help="Also write rows here.")] = None,
) -> None:
    """ECCache on a remote store vs the raw client (redis-py, boto3), same bytes, same run."""
    import contextlib
    import os

    from ..bench.remote import run_remote_bench
    from ..bench.servers import local_redis, local_s3

    if not (redis_url or s3_url or local_servers):
        fail("give --redis-url, --s3-url or --local-servers", 2)
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if local_servers:
            redis_url = redis_url or stack.enter_context(local_redis())
            if s3_url is None:
                s3_endpoint_url = stack.enter_context(local_s3())
                s3_url = "s3://lmcache-ec-bench/bench"
                for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                    os.environ.setdefault(name, "bench")
                os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        if redis_url:
            rows += run_remote_bench("redis", redis_url, iterations=iterations)
        if s3_url:
            rows += run_remote_bench(
                "s3", s3_url, endpoint_url=s3_endpoint_url, iterations=iterations
            )
    table = Table(title="Remote tier: median (p99) ms per op; ratio = lmcache-ec / raw client")
    for column in ("store", "op", "engine", "ms", "ratio", "hits"):
        table.add_column(column)
    for row in rows:
        ratio = f"{row['ratio']:.2f}" if "ratio" in row else ""
        table.add_row(
            row["tier"],
            row["op"],
            row["engine"],
            f"{_ms(row['median_ms'])} ({_ms(row['p99_ms'])})",
            ratio,
            str(row.get("hits", "")),
        )
    console.print(table)
    if as_json is not None:
        as_json.write_text(json.dumps(rows, indent=2))


@bench_app.command()
def connector(
    model_dir: Annotated[
        Path, typer.Argument(help="A local model directory vLLM can read (config + tokenizer).")
    ] = Path("tests/vllm/data/tiny-blip2"),
    as_json: Annotated[Path | None, typer.Option("--json", help="Also write results here.")] = None,
) -> None:
    """has_cache_item and save_caches cost of the vLLM connector (needs vllm)."""
    import os

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not (model_dir / "config.json").exists():
        fail(f"{model_dir} has no config.json", 2)
    from ..bench.connector import bench_connector

    result = bench_connector(str(model_dir))
    console.print_json(data=result)
    if as_json is not None:
        as_json.write_text(json.dumps(result, indent=2))
