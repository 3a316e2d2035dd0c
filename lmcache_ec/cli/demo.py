"""``demo``: the encoder tier on a real vision tower, end to end, no servers."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..config import ConfigError
from .common import ConfigOption, config_source, console, fail, new_table


class _Bar:
    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = None

    def phase(self, name: str, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, visible=False)
        self.task = self.progress.add_task(name, total=total)

    def advance(self) -> None:
        self.progress.advance(self.task)


def demo(
    config: ConfigOption = None,
    images: Annotated[int, typer.Option(help="Distinct generated images.")] = 48,
    requests: Annotated[int, typer.Option(help="Image requests to replay (Zipf).")] = 300,
    seed: Annotated[int, typer.Option(help="Seed of images, workload and tower weights.")] = 0,
    reuse: Annotated[
        bool, typer.Option(help="Keep entries of an earlier demo run instead of starting empty.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Encode generated images with a SigLIP tower on CPU, cache them, replay a workload."""
    from ..bench.demo_workload import run_demo

    if images < 1 or requests < 1:
        fail("--images and --requests must be >= 1", 2)
    source = config_source(config)
    columns = (
        TextColumn("{task.description:>15}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console, transient=True, disable=as_json) as progress:
            report = run_demo(
                source,
                images=images,
                requests=requests,
                seed=seed,
                reuse=reuse,
                reporter=_Bar(progress),
            )
    except ConfigError as exc:
        fail(f"invalid configuration: {exc}", 2)
    if as_json:
        console.print_json(json.dumps(report.as_dict()))
    else:
        _print(report)
    if report.mismatched:
        fail(f"{report.mismatched} cached outputs differ from a fresh encode")


def _print(report) -> None:
    console.print(
        f"SigLIP vision tower (random weights, CPU): {report.tokens}x{report.hidden} bfloat16 "
        f"per image; tiers {', '.join(report.tiers)} ({report.config_source})"
    )
    tiers = sorted({t for p in report.phases for t in p.hits} | set(report.tiers) - {"remote"})
    numbers = ("requests", *[f"{t} hits" for t in tiers], "misses (encoded)", "hit rate")
    table = new_table(
        f"{report.requests} requests over {report.images} images (Zipf)",
        ("phase", *numbers),
        right=numbers,
    )
    for phase in report.phases:
        rate = phase.hit_count / phase.requests if phase.requests else 0.0
        table.add_row(
            phase.name,
            str(phase.requests),
            *[
                f"{phase.hits.get(t, 0)} ({phase.hits.get(t, 0) / phase.requests:.0%})"
                for t in tiers
            ],
            str(phase.misses),
            f"{rate:.0%}",
        )
    console.print(table)
    table = new_table("Time", ("", "seconds"), right=("seconds",))
    table.add_row(
        f"encoding ({report.encode_count} encodes, "
        f"{report.mean_encode_seconds * 1000:.0f} ms each)",
        f"{report.encode_seconds:.2f}",
    )
    table.add_row("cache get + put", f"{report.cache_seconds:.2f}")
    table.add_row("total with lmcache-ec", f"{report.actual_seconds:.2f}")
    table.add_row(
        f"re-encoding every request (est. {report.requests} x mean encode)",
        f"{report.baseline_seconds:.2f}",
    )
    saved = report.baseline_seconds - report.actual_seconds
    speedup = report.baseline_seconds / report.actual_seconds if report.actual_seconds else 0.0
    table.add_row("[bold]time saved[/]", f"[bold]{saved:.2f}[/] ({speedup:.1f}x faster)")
    console.print(table)
    verdict = "[green]bit-identical[/]" if not report.mismatched else "[red]MISMATCH[/]"
    console.print(f"{report.verified} cached outputs vs a fresh encode: {verdict}")
    if report.removed_before:
        console.print(
            f"[dim]Cleared {report.removed_before} entries of an earlier demo run "
            "first (--reuse keeps them).[/]"
        )
