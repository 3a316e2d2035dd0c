"""``bench channel``: step time the connector adds under stage-channel load (see
``lmcache_ec.bench.channel_load``)."""

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
    ("busy_steps", "steps with requests running", "{:.0f}"),
    ("busy_median_ms", "connector time per busy step, median (ms)", "{:.2f}"),
    ("busy_p99_ms", "connector time per busy step, p99 (ms)", "{:.2f}"),
    ("busy_max_ms", "connector time per busy step, max (ms)", "{:.1f}"),
    ("idle_max_ms", "connector time per idle step, max (ms)", "{:.1f}"),
    ("largest_order_step", "items ordered over the channel in one step", "{:.0f}"),
    ("requests_finished", "image requests finished", "{:.0f}"),
    ("encoded", "images encoded", "{:.0f}"),
    ("loaded_bit_exact", "images loaded, bit-exact", "{:.0f}"),
    ("hostile_connections", "hostile peer's connections", "{:.0f}"),
)


def channel(
    model_dir: Annotated[
        Path | None,
        typer.Option(help="Model directory vLLM can read (default: the packaged tiny BLIP-2)."),
    ] = None,
    items: Annotated[int, typer.Option(help="Images ordered over the channel in one step.")] = 5000,
    busy: Annotated[int, typer.Option(help="Text requests decoding all along.")] = 4,
    pause_s: Annotated[
        float,
        typer.Option(
            parser=non_negative_float,
            help="Seconds the scheduler stops reading, after the big order.",
        ),
    ] = 2.0,
    forward_ms: Annotated[
        float, typer.Option(parser=non_negative_float, help="Simulated forward pass per step.")
    ] = 5.0,
    busy_stage_wait_s: Annotated[
        float,
        typer.Option(
            parser=non_negative_float,
            help="The connector's busy_stage_wait_s (the budget measured against).",
        ),
    ] = 0.01,
    hostile: Annotated[
        bool, typer.Option(help="A peer on each worker's socket that never reads.")
    ] = True,
    as_json: Annotated[
        Path | None, typer.Option("--json", parser=output_file, help="Also write results here.")
    ] = None,
) -> None:
    """Connector time per step with thousands of items a step on the stage channel (needs vllm)."""
    directory = simulated_engine_model(model_dir)
    if items < 1 or busy < 1:
        fail("--items and --busy must be >= 1", 2)
    from ..bench.channel_load import ChannelBenchSettings, run_channel

    settings = ChannelBenchSettings(
        model_dir=directory,
        items=items,
        busy=busy,
        pause_s=pause_s,
        forward_ms=forward_ms,
        busy_stage_wait_s=busy_stage_wait_s,
        hostile=hostile,
    )
    run_and_show(
        "saving, then loading, every image through the stage channel…",
        lambda: run_channel(settings),
        print_channel,
        as_json,
    )


def print_channel(result: dict[str, Any]) -> None:
    phases = result["phases"]
    settings = result["settings"]
    table = new_table(
        f"Stage channel, {settings['items']} items a step (V1 call pattern)",
        ("", *phases),
        right=phases,
    )
    for key, label, fmt in _ROWS:
        table.add_row(label, *(fmt.format(phases[phase][key]) for phase in phases))
    console.print(table)
    verdict = "within" if result["p99_within_target"] else "OVER"
    console.print(
        f"Connector time per busy step, p99 over both phases: {result['all']['busy_p99_ms']:.2f} ms"
        f" ({verdict} busy_stage_wait_s + 1 ms = {result['target_ms']:.1f} ms); "
        f"max {result['all']['busy_max_ms']:.1f} ms over {result['all']['busy_steps']} busy steps."
    )
    largest = ", ".join(f"{ms:.1f}" for ms in result["all"]["busy_largest_ms"])
    console.print(f"Largest busy steps (ms): {largest}.")
