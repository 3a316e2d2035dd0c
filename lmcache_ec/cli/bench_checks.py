"""``bench node-reads`` and ``bench fingerprint``: what two safety checks cost."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import console, fail, new_table, output_file, positive_float, write_json


def node_reads(
    iterations: Annotated[int, typer.Option(help="Entries read per method and shape.")] = 50,
    as_json: Annotated[
        Path | None, typer.Option("--json", parser=output_file, help="Also write results here.")
    ] = None,
) -> None:
    """Node-tier reads (copied out, verified) next to a mapping of the file, per bench shape."""
    from ..bench.node_reads import SHAPES, run

    if iterations < 1:
        fail("--iterations must be >= 1", 2)
    rows = run(SHAPES, iterations, lambda text: console.print(f"[dim]{text}[/]"))
    table = new_table(
        "Node-tier read + verify, ms per entry (median; p99)",
        ("model", "shape", "mapped (reference)", "copied", "copied / mapped", "get"),
    )
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
    write_json(as_json, rows)


def fingerprint(
    tensors: Annotated[int, typer.Option(help="bfloat16 tensors fingerprinted per pass.")] = 8,
    elements: Annotated[int, typer.Option(help="Elements per tensor.")] = 8 * 1024 * 1024,
    repeat: Annotated[int, typer.Option(help="Passes per method (interleaved).")] = 5,
    gpu_bandwidth_gbs: Annotated[
        float,
        typer.Option(
            parser=positive_float, help="Device memory bandwidth for the GPU estimate (GB/s)."
        ),
    ] = 3000.0,
    link_gbs: Annotated[
        float,
        typer.Option(
            parser=positive_float, help="Device-to-host bandwidth for the GPU estimate (GB/s)."
        ),
    ] = 25.0,
    as_json: Annotated[
        Path | None, typer.Option("--json", parser=output_file, help="Also write results here.")
    ] = None,
) -> None:
    """Weights fingerprint cost on the CPU (old sums, mixed sum, host copy + hash), GPU estimate."""
    from ..bench.fingerprint import run

    if min(tensors, elements, repeat) < 1:
        fail("--tensors, --elements and --repeat must be >= 1", 2)
    result = run(tensors, elements, repeat, gpu_bandwidth_gbs, link_gbs)
    size = result["bytes"] / 1e6
    table = new_table(
        f"Fingerprint of {tensors} x {elements} bf16 ({size:.0f} MB), "
        f"{result['threads']} torch threads: ms per GB (median)",
        ("method", "CPU ms/GB", "CPU MB/s", "GPU estimate ms/GB"),
    )
    estimate = result["gpu_estimate"]
    for method in ("sums", "mixed", "host_hash", "hash"):
        row = result[method]
        gpu = estimate.get(f"{method}_ms_per_gb")
        table.add_row(
            method,
            f"{row['ms_per_gb']:.0f}",
            f"{row['mb_s']:.0f}",
            "-" if gpu is None else f"{gpu:.1f}",
        )
    console.print(table)
    console.print(
        f"mixed / sums: {result['mixed_vs_sums']:.2f}x; "
        f"host_hash / mixed: {result['host_hash_vs_mixed']:.2f}x"
    )
    write_json(as_json, result)
