"""``bench node-reads`` and ``bench fingerprint``: what two safety checks cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .common import console, fail


def node_reads(
    iterations: Annotated[int, typer.Option(help="Entries read per method and shape.")] = 50,
    as_json: Annotated[Path | None, typer.Option("--json", help="Also write results here.")] = None,
) -> None:
    """Node-tier reads (copied out, verified) next to a mapping of the file, per bench shape."""
    from ..bench.node_reads import SHAPES, run

    if iterations < 1:
        fail("--iterations must be >= 1", 2)
    rows = run(SHAPES, iterations, lambda text: console.print(f"[dim]{text}[/]"))
    table = Table(title="Node-tier read + verify, ms per entry (median; p99)")
    for column in ("model", "shape", "mapped (reference)", "copied", "copied / mapped", "get"):
        table.add_column(column)
    for row in rows:

        def cell(method: str, row: dict = row) -> str:
            found = row[method]
            return f"{found['median_ms']:.3f} ({found['p99_ms']:.3f})"

        table.add_row(
            row["model"],
            "x".join(map(str, row["shape"])),
            cell("mapped"),
            cell("copied"),
            f"{row['copied_vs_mapped']:.2f}x",
            cell("get"),
        )
    console.print(table)
    if as_json is not None:
        as_json.write_text(json.dumps(rows, indent=2))
