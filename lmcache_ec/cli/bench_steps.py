"""``bench steps``: engine step time with and without prefetch (see ``lmcache_ec.bench.steps``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .common import (
    console,
    fail,
    new_table,
    non_negative_float,
    output_file,
    run_and_show,
    simulated_engine_model,
)

_ROWS = (
    ("steps", "engine steps", "{:.0f}"),
    ("step_median_ms", "step median (ms)", "{:.1f}"),
    ("step_p99_ms", "step p99 (ms)", "{:.1f}"),
    ("step_max_ms", "step max (ms)", "{:.1f}"),
    ("overhead_median_ms", "step overhead median (ms)", "{:.2f}"),
    ("overhead_p99_ms", "step overhead p99 (ms)", "{:.1f}"),
    ("overhead_max_ms", "step overhead max (ms)", "{:.1f}"),
    ("overhead_total_ms", "step overhead, whole run (ms)", "{:.0f}"),
    ("local_request_median_ms", "local-work request, median latency (ms)", "{:.0f}"),
    ("remote_request_median_ms", "remote-hit request, median latency (ms)", "{:.0f}"),
    ("loads_read_inside_step", "loads read from a tier inside a step", "{:.0f}"),
    ("remote_images_encoded", "remote-hit images encoded", "{:.0f}"),
)


def steps(
    model_dir: Annotated[
        Path | None,
        typer.Option(help="Model directory vLLM can read (default: the packaged tiny BLIP-2)."),
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option(help="Use this Redis (default: start one on 127.0.0.1).")
    ] = None,
    delay_ms: Annotated[
        float, typer.Option(parser=non_negative_float, help="Latency added to every Redis command.")
    ] = 50.0,
    arrivals: Annotated[int, typer.Option(help="Requests arriving during the run.")] = 24,
    busy: Annotated[int, typer.Option(help="Text requests decoding all along.")] = 4,
    forward_ms: Annotated[
        float, typer.Option(parser=non_negative_float, help="Simulated forward pass per step.")
    ] = 5.0,
    encode_ms: Annotated[
        float, typer.Option(parser=non_negative_float, help="Simulated encoder time per image.")
    ] = 20.0,
    as_json: Annotated[
        Path | None, typer.Option("--json", parser=output_file, help="Also write results here.")
    ] = None,
) -> None:
    """Step time with prefetch vs. remote reads inside the step (needs vllm, redis-server)."""
    directory = simulated_engine_model(model_dir)
    for name, value in (("--arrivals", arrivals), ("--busy", busy)):
        if value < 1:
            fail(f"{name} must be >= 1", 2)
    from ..bench.steps import StepBenchSettings, run_steps

    settings = StepBenchSettings(
        model_dir=directory,
        redis_url=redis_url,
        delay_ms=delay_ms,
        arrivals=arrivals,
        busy=busy,
        forward_ms=forward_ms,
        encode_ms=encode_ms,
    )
    run_and_show(
        "running the engine with and without prefetch…",
        lambda: run_steps(settings),
        print_steps,
        as_json,
    )


def print_steps(result: dict[str, Any]) -> None:
    modes = result["modes"]
    columns = ("prefetch (lmcache-ec)", "read inside the step")
    table = new_table(
        f"Engine steps, Redis +{result['settings']['delay_ms']:.0f} ms per command",
        ("", *columns),
        right=columns,
    )
    for key, label, fmt in _ROWS:
        table.add_row(label, fmt.format(modes["prefetch"][key]), fmt.format(modes["in-step"][key]))
    console.print(table)
    ratios = result["ratios"]
    console.print(
        "Overhead = step time outside the simulated forward pass and encoder. "
        "Reading inside the step vs prefetch: "
        f"overhead max {ratios['overhead_max_in_step_over_prefetch']:.1f}x, "
        f"overhead total {ratios['overhead_total_in_step_over_prefetch']:.1f}x, "
        f"step p99 {ratios['step_p99_in_step_over_prefetch']:.1f}x, "
        f"local-work latency {ratios['local_request_in_step_over_prefetch']:.2f}x"
    )
