"""``bench``: measurements with a baseline in the same run (see ``lmcache_ec.bench``)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ..remote_names import check_url, redact
from .common import (
    chart_file,
    console,
    fail,
    human_bytes,
    new_table,
    non_negative_float,
    output_file,
    positive_float,
    run_with_status,
    write_json,
    write_report,
)

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


# What the benchmarks' raw client (redis-py's ``Redis.from_url``) can measure.
REDIS_SCHEMES = ("redis", "rediss", "unix")


def _check_redis_url(url: str | None) -> None:
    """Refuse, before any job starts, a --redis-url that names no single Redis server."""
    if url is None:
        return
    if url.partition("://")[0] in REDIS_SCHEMES:
        reason = check_url(url)
    else:
        reason = f"must name one Redis server ({', '.join(s + '://' for s in REDIS_SCHEMES)})"
    if reason:
        fail(f"invalid --redis-url {redact(url)!r}: {reason}", 2)


def _check_directory(directory: str | None) -> None:
    if directory is not None and not os.path.isdir(directory):
        fail(f"--directory {directory!r} is not an existing directory", 2)


def _check_startup_gb(size: float) -> None:
    # Upstream's engine given a CPU tier of <= 0 GB never returns from start-up.
    if not (math.isfinite(size) and size > 0):
        fail(f"--startup-cpu-gb must be a number > 0, not {size}", 2)


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


@bench_app.callback(invoke_without_command=True)
def bench_all(
    ctx: typer.Context,
    quick: Annotated[
        bool, typer.Option("--quick", help="One shape, fewer iterations: a few minutes.")
    ] = False,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", parser=output_file, help="Write the full result (JSON) here."),
    ] = None,
    chart: Annotated[
        Path | None,
        typer.Option(
            parser=chart_file,
            help="Chart path: .png, .svg or .pdf (default: next to --json, else ./bench.png).",
        ),
    ] = None,
    no_chart: Annotated[bool, typer.Option("--no-chart", help="Do not draw the chart.")] = False,
    markdown: Annotated[
        Path | None,
        typer.Option(parser=output_file, help="Also write the table as Markdown here."),
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
    repeat: Annotated[
        int,
        typer.Option(
            min=1,
            help="Run every job this many times, each in a fresh process, and report "
            "the median of the runs (one process's memory state can move a read row "
            "by 2-3x; see docs/benchmarks.md).",
        ),
    ] = 1,
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
    _check_redis_url(redis_url)
    _check_directory(directory)
    _check_startup_gb(startup_cpu_gb)
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
        "repeat": repeat,
    }
    given = {k: v for k, v in options.items() if v is not None}
    make = BenchSettings.quick_defaults if quick else BenchSettings
    settings = make(**given, **common)
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
    cpu_gb: Annotated[
        float,
        typer.Option(
            parser=positive_float,
            help="Memory budget (GB): refuse a run whose CPU tiers need more.",
        ),
    ] = 1.0,
    startup_cpu_gb: Annotated[
        float, typer.Option(help="CPU tier size for the start-up measurement (GB).")
    ] = 2.0,
    startup: Annotated[bool, typer.Option(help="Measure start-up time and RSS.")] = True,
    threads: Annotated[
        int,
        typer.Option(min=1, help="torch intra-op threads during the run (same for every engine)."),
    ] = 1,
    directory: Annotated[
        str | None, typer.Option(help="Where the temporary disk tiers go (default: $TMPDIR).")
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json", parser=output_file, help="Also write the results to this JSON file."
        ),
    ] = None,
) -> None:
    """Put/get latency on the CPU and disk tiers: lmcache-ec vs LMCache's ECCacheEngine."""
    from ..bench.focused import LocalBenchSettings, run_local
    from ..key import SUPPORTED_DTYPES

    names = [d.strip() for d in dtypes.split(",") if d.strip()]
    for name in names:
        if name not in SUPPORTED_DTYPES:
            fail(f"unsupported dtype {name!r}; use {', '.join(SUPPORTED_DTYPES)}", 2)
    if iterations < 1:
        fail("--iterations must be >= 1", 2)
    _check_directory(directory)
    _check_startup_gb(startup_cpu_gb)
    settings = LocalBenchSettings(
        shapes=_shapes(shapes),
        dtypes=names,
        iterations=iterations,
        startup_cpu_gb=startup_cpu_gb,
        startup=startup,
        threads=threads,
        directory=directory,
    )
    needed = max(r * c for r, c in settings.shapes) * 4 * iterations * 1.2
    if needed > cpu_gb * 1024**3:
        fail(f"--cpu-gb {cpu_gb} cannot hold {iterations} entries of the largest shape", 2)
    try:
        result = run_with_status("bench local", lambda progress, _: run_local(settings, progress))
    except RuntimeError as exc:  # a job failed: its last error line, not a traceback
        fail(f"bench local failed: {exc}")
    _print_flat(
        "CPU and disk tiers: ms per item (hits = reads that returned the tensor)", result["rows"]
    )
    table = new_table(
        "Median ratios: baseline / lmcache-ec (>1: lmcache-ec is faster)",
        ("shape", "tier", "op", "ours ms", "vs upstream", "vs upstream walk", "vs floor"),
    )
    for entry in result["ratios"]:

        def ratio(label: str, entry: dict[str, Any] = entry) -> str:
            if f"vs_{label}" not in entry:
                return "-"
            if entry.get(f"{label}_hits") == 0:
                return "[red]baseline missed[/]"
            return f"{entry[f'vs_{label}']:.2f}x"

        table.add_row(
            f"{'x'.join(map(str, entry['shape']))} {entry['dtype']}",
            entry["tier"],
            entry["op"],
            _ms(entry["ours_ms"]),
            ratio("upstream"),
            ratio("upstream_walk"),
            ratio("floor"),
        )
    console.print(table)
    startup_result = result.get("startup") or {}
    if startup_result:
        table = new_table(
            f"Start-up with a {startup_result['cpu_gb']} GB CPU tier (fresh process)",
            ("engine", "seconds", "RSS growth"),
        )
        for engine in ("lmcache-ec", "ECCacheEngine"):
            data = startup_result.get(engine, {})
            if "error" in data:
                table.add_row(engine, "[red]failed[/]", escape(str(data["error"])))
            else:
                table.add_row(
                    engine, f"{data['seconds']:.3f}", f"{data['rss_bytes'] / 1024**2:.0f} MB"
                )
        console.print(table)
    write_json(json_path, result)


LEGEND = {
    "lmcache-ec": "ours",
    "ECCacheEngine": "upstream",
    "ECCacheEngine (StorageManager.get)": "upstream walk",
}


def _print_flat(title: str, rows: list[dict[str, Any]]) -> None:
    """The focused subcommands' flat rows (see ``bench.focused``), a table per shape."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(f"{'x'.join(map(str, row['shape']))} {row['dtype']}", []).append(row)
    for shape, group in groups.items():
        table = new_table(
            f"{shape}: {title}",
            ("tier", "op", "engine", "median", "p99", "hits", "ratio"),
            right=("median", "p99"),
        )
        for row in group:
            hits = row.get("hits")
            if isinstance(hits, dict):
                hits = " ".join(f"{tier} {n}" for tier, n in hits.items())
            elif hits is not None:
                hits = f"{hits}/{row['n']}"
            table.add_row(
                row["tier"],
                row["op"],
                LEGEND.get(row["engine"], row["engine"].replace("ECCacheEngine", "upstream")),
                _ms(row["median_ms"]),
                _ms(row["p99_ms"]),
                hits or "",
                f"{row['ratio']:.2f}x" if "ratio" in row else "",
                style="red" if row.get("hits") == 0 else None,
            )
        console.print(table)
    console.print("  " + "; ".join(f"{short} = {name}" for name, short in LEGEND.items()))


@bench_app.command()
def remote(
    redis_url: Annotated[
        str | None, typer.Option(help="Measure this Redis (redis://, rediss://, unix://).")
    ] = None,
    s3_url: Annotated[str | None, typer.Option(help="Measure this S3 prefix (s3://b/p).")] = None,
    s3_endpoint_url: Annotated[
        str | None, typer.Option(help="Endpoint of an S3-compatible store.")
    ] = None,
    local_servers: Annotated[
        bool,
        typer.Option(help="Start a redis-server and moto (bench extra) on 127.0.0.1 and use them."),
    ] = False,
    iterations: Annotated[int, typer.Option(min=1)] = 50,
    as_json: Annotated[
        Path | None, typer.Option("--json", parser=output_file, help="Also write rows here.")
    ] = None,
) -> None:
    """ECCache on a remote store vs upstream and the raw client (redis-py, boto3), same run."""
    import contextlib

    from ..bench.focused import run_remote
    from ..bench.run import LOCAL_S3_BUCKET, LOCAL_S3_CREDENTIALS
    from ..bench.servers import MissingDependency, local_redis, moto_process, probe_redis

    if not (redis_url or s3_url or local_servers):
        fail("give --redis-url, --s3-url or --local-servers", 2)
    _check_redis_url(redis_url)
    if redis_url and (reason := probe_redis(redis_url)):
        fail(reason)  # before starting a job: its error would be a worker's traceback

    def measure(progress: Any, _: str) -> list[dict[str, Any]]:
        nonlocal redis_url, s3_url, s3_endpoint_url
        rows: list[dict[str, Any]] = []
        env: dict[str, str] = {}
        with contextlib.ExitStack() as stack:
            if local_servers:
                redis_url = redis_url or stack.enter_context(local_redis())
                if s3_url is None:
                    s3_endpoint_url = stack.enter_context(moto_process(LOCAL_S3_BUCKET))
                    s3_url = f"s3://{LOCAL_S3_BUCKET}/bench"
                    env = dict(LOCAL_S3_CREDENTIALS)
            if redis_url:
                rows += run_remote("redis", redis_url, iterations=iterations, progress=progress)
            if s3_url:
                rows += run_remote(
                    "s3",
                    s3_url,
                    endpoint_url=s3_endpoint_url,
                    region=env.get("AWS_DEFAULT_REGION"),
                    iterations=iterations,
                    env=env,
                    progress=progress,
                )
        return rows

    try:
        rows = run_with_status("bench remote", measure)
    except MissingDependency as exc:
        fail(str(exc), 2)
    except RuntimeError as exc:  # a job failed: its last error line, not a traceback
        fail(f"bench remote failed: {exc}")
    _print_flat("Remote tier: ms per item; ratio = raw client / lmcache-ec (>1: faster)", rows)
    write_json(as_json, rows)


@bench_app.command()
def connector(
    model_dir: Annotated[
        Path, typer.Argument(help="A local model directory vLLM can read (config + tokenizer).")
    ] = Path("tests/vllm/data/tiny-blip2"),
    as_json: Annotated[
        Path | None, typer.Option("--json", parser=output_file, help="Also write results here.")
    ] = None,
) -> None:
    """has_cache_item and save_caches cost of the vLLM connector (needs vllm)."""
    if not (model_dir / "config.json").exists():
        fail(f"{model_dir} has no config.json", 2)
    from ..bench.focused import run_connector

    result = run_with_status(
        "bench connector", lambda progress, _: run_connector(str(model_dir.resolve()), progress)
    )
    console.print_json(data=result)
    write_json(as_json, result)


@bench_app.command()
def fleet(
    nodes: Annotated[int, typer.Option(min=1, help="Engine processes sharing the store.")] = 4,
    requests: Annotated[int, typer.Option(min=1, help="Requests in the stream.")] = 400,
    images: Annotated[int, typer.Option(min=1, help="Distinct images the stream draws.")] = 100,
    zipf: Annotated[
        float, typer.Option(parser=non_negative_float, help="Zipf exponent of image popularity.")
    ] = 1.1,
    interval_ms: Annotated[
        float,
        typer.Option(
            parser=non_negative_float, help="One request every this many ms, round-robin."
        ),
    ] = 10.0,
    encode_ms: Annotated[
        float, typer.Option(parser=non_negative_float, help="Encoder time per image.")
    ] = 30.0,
    forward_ms: Annotated[
        float, typer.Option(parser=non_negative_float, help="Forward pass per step.")
    ] = 2.0,
    shape: Annotated[str, typer.Option(help="Encoder output ROWSxCOLS (bfloat16).")] = "256x2560",
    store: Annotated[
        str, typer.Option(help="Shared tier: redis or s3; with --api also disk (one directory).")
    ] = "redis",
    api: Annotated[
        bool,
        typer.Option(
            "--api",
            help="Plain processes through the library API instead of vLLM engines: "
            "get/put beside get_or_compute, on one process and on the fleet.",
        ),
    ] = False,
    claims: Annotated[
        str,
        typer.Option(
            help="Encode claims: auto (off, and on when the connector has them), off, on."
        ),
    ] = "auto",
    claim_wait_s: Annotated[
        float,
        typer.Option(
            parser=non_negative_float,
            help="How long a process waits for another's claimed encode.",
        ),
    ] = 1.0,
    baseline: Annotated[bool, typer.Option(help="Also run the stream on one process.")] = True,
    redis_url: Annotated[
        str | None, typer.Option(help="Use this Redis (default: start a redis-server).")
    ] = None,
    s3_endpoint: Annotated[
        str | None,
        typer.Option(help="S3 endpoint with --store s3 (default: start moto, the bench extra)."),
    ] = None,
    s3_url: Annotated[str, typer.Option(help="Bucket and prefix with --store s3.")] = (
        "s3://lmcache-ec-bench/fleet"
    ),
    seed: Annotated[int, typer.Option(help="Seed of the image stream.")] = 0,
    node_tier: Annotated[
        bool,
        typer.Option(
            "--node-tier",
            help="Give the processes (all on this machine) one shared host copy "
            "per node (node_tier) instead of a CPU tier each.",
        ),
    ] = False,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", parser=output_file, help="Write the full result (JSON) here."),
    ] = None,
) -> None:
    """N engine processes (vLLM's scheduler + lmcache-ec's connector) on one store, one
    Zipf image stream: encoder runs, hit rate, bytes per tier, memory per node."""
    from ..bench.fleet import FleetSettings, claims_supported, run_fleet
    from ..bench.servers import MissingDependency

    if store not in ("redis", "s3", "disk") or (store == "disk" and not api):
        fail(f"unknown store {store!r}; choose redis or s3 (or disk, with --api)", 2)
    if claims not in ("auto", "off", "on"):
        fail(f"--claims must be auto, off or on, not {claims!r}", 2)
    if claims == "on" and not claims_supported():
        fail("--claims on: this connector has no claim_encodes setting", 2)
    rows, cols = _shapes(shape)[0]
    settings = FleetSettings(
        nodes=nodes,
        requests=requests,
        images=images,
        zipf=zipf,
        interval_ms=interval_ms,
        encode_ms=encode_ms,
        forward_ms=forward_ms,
        shape=(rows, cols),
        store=store,
        claims=claims,
        claim_wait_s=claim_wait_s,
        baseline=baseline,
        redis_url=redis_url,
        s3_endpoint=s3_endpoint,
        s3_url=s3_url,
        seed=seed,
        node_tier=node_tier,
    )
    if api:
        from ..bench.fleet_api import run_fleet_api

        runner = run_fleet_api
    else:
        runner = run_fleet
    try:
        result = run_with_status(
            "lmcache-ec bench fleet",
            lambda progress, command: runner(settings, progress, command),
        )
    except MissingDependency as exc:
        fail(str(exc), 2)
    except RuntimeError as exc:  # a process failed: its last error line, not a traceback
        fail(str(exc))
    if api:
        print_fleet_api(result)
    else:
        print_fleet(result)
    write_json(json_path, result)


def print_fleet_api(result: dict[str, Any]) -> None:
    settings = result["settings"]
    table = new_table(
        f"fleet through the library API: {settings['requests']} requests over "
        f"{settings['images']} images (Zipf {settings['zipf']}), shared {settings['store']}",
        ("run", "encodes", "per image", "hit rate", "vs 1 process", "waits", "waiter p50/p99"),
    )
    for run in result["runs"]:
        vs, waited = run["hit_rate_vs_one_process"], run["waiter_ms"]
        table.add_row(
            run["label"],
            f"{run['encodes']} / {run['unique_images']}",
            f"{run['encodes_per_unique']:.2f}",
            f"{run['hit_rate']:.1%}",
            "-" if vs is None else f"{vs:.2f}x",
            str(run["waits"]),
            "-" if waited["p50"] is None else f"{waited['p50']:.1f} / {waited['p99']:.1f} ms",
        )
    console.print(table)


def print_fleet(result: dict[str, Any]) -> None:
    settings = result["settings"]
    table = new_table(
        f"fleet: {settings['requests']} requests over {settings['images']} images "
        f"(Zipf {settings['zipf']}), shared {settings['store']}",
        ("run", "encodes", "per image", "hits", "hit rate", "vs 1 process", "tier hits"),
    )
    for run in result["runs"]:
        vs = run["hit_rate_vs_one_process"]
        table.add_row(
            run["label"],
            str(run["encodes"]),
            f"{run['encodes_per_unique']:.2f}",
            f"{run['hits']}/{run['requests']}",
            f"{run['hit_rate']:.1%}",
            "-" if vs is None else f"{vs:.2f}x",
            " ".join(f"{t} {n}" for t, n in run["tier_hits"].items()) or "-",
        )
    console.print(table)
    table = new_table(
        "bytes moved per tier (put / get) and host copies at the end",
        ("run", *sorted({t for run in result["runs"] for t in run["bytes"]}), "copies"),
    )
    for run in result["runs"]:
        memory = run["memory"]
        table.add_row(
            run["label"],
            *(
                f"{human_bytes(b['put'])} / {human_bytes(b['get'])}" if b else "-"
                for b in (run["bytes"].get(t) for t in [c.header for c in table.columns[1:-1]])
            ),
            f"{human_bytes(memory['per_process_bytes'])} (one copy each: "
            f"{human_bytes(memory['one_copy_bytes'])})"
            + (
                ""
                if memory.get("node_tier_bytes") is None
                else f"; node tier {human_bytes(memory['node_tier_bytes'])}"
            ),
        )
    console.print(table)
    if not result["claims_supported"]:
        console.print("  encode claims: not in this connector; every run has them off")
