"""The result of ``run_bench`` as one table: rich for the terminal, Markdown for docs.

Rows are (tier, shape, op); columns are lmcache-ec's median (p99) and
throughput, then each baseline's median and the ratio to it. Footnotes carry
what a cell cannot: why a baseline is n/a, what upstream's ``get()`` did.
"""

from __future__ import annotations

from typing import Any

from .run import shape_name
from .targets import CONVENTION, REFERENCES

HEADERS = [
    "tier",
    "shape",
    "op",
    "ours ms (p99)",
    "MB/s",
    "upstream ms",
    "xup",
    "example ms",
    "xex",
    "limit ms",
    "xlim",
    "target",
]


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.1:
        return f"{value * 1000:.2f}µs"
    if value < 10:
        return f"{value:.3f}"
    return f"{value:.1f}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


class Footnotes:
    def __init__(self) -> None:
        self.notes: dict[str, int] = {}

    def mark(self, text: str) -> str:
        if not text:
            return ""
        number = self.notes.setdefault(text, len(self.notes) + 1)
        return f" [{number}]"

    def lines(self) -> list[str]:
        return [f"[{n}] {text}" for text, n in self.notes.items()]


def _baseline_cell(base: dict[str, Any] | None, notes: Footnotes) -> str:
    if not base:
        return ""
    if "na" in base:
        return "n/a" + notes.mark(f"{base['label']}: {base['na']}")
    text = ms(base["median_ms"])
    if base.get("hits") is not None and base["hits"] < base["n"]:
        text = f"miss {base['hits']}/{base['n']}"
    return text + notes.mark(f"{base['label']}: {base['note']}" if base.get("note") else "")


def _target_cell(row: dict[str, Any], markup: bool) -> str:
    cells = []
    for target in row.get("targets", []):
        if target["pass"] is None:
            verdict = "n/a"
        else:
            verdict = "PASS" if target["pass"] else "FAIL"
            if markup:
                verdict = f"[{'green' if target['pass'] else 'red'}]{verdict}[/]"
        if target["kind"] == "min_ratio" and target["value"] is None:
            rule = f"(no {target['baseline']} ratio)"
        elif target["kind"] == "min_ratio":
            rule = f"{target['value']:.2f}≥{target['threshold']:g} vs {target['baseline']}"
        else:
            rule = f"{ms(target['value'])}≤{ms(target['threshold'])}"
        reference = references_text(target)
        cells.append(f"{verdict} {rule}" + (f" ({reference})" if reference else ""))
    return "; ".join(cells)


def references_text(target: dict[str, Any]) -> str:
    """The target's reference ratios measured this run, in words ("" for none)."""
    return "; ".join(
        REFERENCES[name].show(value)
        for name, value in target.get("references", {}).items()
        if value is not None
    )


def table_rows(result: dict[str, Any], markup: bool = False) -> tuple[list[list[str]], Footnotes]:
    notes = Footnotes()
    out = []
    for row in result["rows"]:
        ours = row["ours"]
        ours_text = f"{ms(ours['median_ms'])} ({ms(ours['p99_ms'])})"
        if ours.get("hits") is not None and ours["hits"] < ours["n"]:
            ours_text += f" MISSED {ours['n'] - ours['hits']}"
        extra = []
        if ours.get("in_flight") is not None:
            extra.append(f"write still running at return: {ours['in_flight']}/{ours['n']}")
        if row.get("cpu_only"):
            extra.append(f"same put, CPU tier only: {ms(row['cpu_only']['median_ms'])} ms")
        if row.get("cpu_read"):
            extra.append(f"{row['cpu_read']['label']}: {ms(row['cpu_read']['median_ms'])} ms")
        once = [row.get(n) for n in ("ours_read_once", "example_read_once", "verified_read_once")]
        if all(once):
            extra.append(
                f"each result read once ({once[0]['note']}): ours {ms(once[0]['median_ms'])} ms, "
                f"example {ms(once[1]['median_ms'])} ms, readinto + xxh3 "
                f"{ms(once[2]['median_ms'])} ms"
            )
        if row.get("verified"):
            reached = row.get("ratios", {}).get("verified")
            extra.append(
                f"{row['verified']['label']}, a verifying read's floor: "
                f"{ms(row['verified']['median_ms'])} ms"
                + (f", {ratio(reached)} of it reached" if reached else "")
            )
        if ours.get("note"):
            extra.append(ours["note"])
        if row.get("note"):
            extra.append(row["note"])
        ours_text += notes.mark("; ".join(extra))
        op = row["op"] + (f" x{row['batch']}" if row.get("batch", 1) > 1 else "")
        r = row.get("ratios", {})
        out.append(
            [
                row["tier"],
                shape_name(row["shape"]),
                op,
                ours_text,
                f"{ours['mb_s']:.0f}" if ours.get("mb_s") else "",
                _baseline_cell(row.get("upstream"), notes),
                ratio(r.get("upstream")) if row.get("upstream") else "",
                _baseline_cell(row.get("example"), notes),
                ratio(r.get("example")) if row.get("example") else "",
                _baseline_cell(row.get("limit"), notes),
                ratio(r.get("limit")) if row.get("limit") else "",
                _target_cell(row, markup),
            ]
        )
    for skip in result["skipped"]:
        text = f"skipped: {skip['skipped']}"
        out.append(
            [
                skip["tier"],
                shape_name(skip.get("shape")),
                "*",
                f"[red]{text}[/]" if markup else text,
            ]
            + [""] * (len(HEADERS) - 4)
        )
    return out, notes


def legend(result: dict[str, Any]) -> list[str]:
    labels = {}
    for row in result["rows"]:
        for name in ("upstream", "example", "limit"):
            base = row.get(name)
            if base:
                labels.setdefault(name, set()).add(base["label"])
    lines = [CONVENTION]
    for name, found in labels.items():
        lines.append(f"{name}: {', '.join(sorted(found))}")
    return lines


def summary_line(result: dict[str, Any]) -> str:
    verdicts = [t["pass"] for t in result["targets"]]
    return (
        f"targets: {verdicts.count(True)} pass, {verdicts.count(False)} fail, "
        f"{verdicts.count(None)} n/a — {result['elapsed_s']} s on "
        f"{result['machine']['cpus']} CPUs"
    )


def _verdicts(row: dict[str, Any], markup: bool) -> str:
    marks = {True: "PASS", False: "FAIL", None: "n/a"}
    colors = {True: "green", False: "red", None: "yellow"}
    out = []
    for target in row.get("targets", []):
        text = marks[target["pass"]]
        out.append(f"[{colors[target['pass']]}]{text}[/]" if markup else text)
    return " ".join(out)


def print_table(result: dict[str, Any], console: Any) -> None:
    """The measurements, then the targets; wide output when not on a terminal."""
    from rich.console import Console
    from rich.table import Table

    if not console.is_terminal:
        console = Console(width=220, highlight=False)
    rows, notes = table_rows(result, markup=True)
    table = Table(
        title="median ms per item (p99); xbaseline = baseline time / ours, >1: lmcache-ec faster",
        title_justify="left",
    )
    headers = [*HEADERS[:-1], "targets"]
    for header in headers:
        table.add_column(header, justify="left" if header in ("tier", "shape", "op") else "right")
    measured = [r for r in result["rows"]]
    for k, cells in enumerate(rows):
        verdicts = _verdicts(measured[k], True) if k < len(measured) else ""
        table.add_row(*cells[:-1], verdicts)
    console.print(table)
    for line in [*legend(result), *notes.lines()]:
        console.print(line, markup=False)
    targets = Table(title="targets", title_justify="left")
    for header in ("tier", "shape", "op", "target", "value", "result", "references"):
        targets.add_column(header)
    for target in result["targets"]:
        if target["kind"] == "min_ratio":
            value = "-" if target["value"] is None else f"{target['value']:.2f}x"
        else:
            value = ms(target["value"])
            value += "" if value.endswith("µs") else " ms"
        verdict = _verdicts({"targets": [target]}, True)
        targets.add_row(
            target["tier"],
            shape_name(target["shape"]),
            target["op"],
            target["text"],
            value,
            verdict,
            references_text(target),
        )
    console.print(targets)
    console.print(summary_line(result))


def markdown(result: dict[str, Any]) -> str:
    """The same table in Markdown (docs/benchmarks.md)."""
    rows, notes = table_rows(result, markup=False)

    def escape(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = [
        "| " + " | ".join(HEADERS) + " |",
        "|" + "|".join("---" for _ in HEADERS) + "|",
    ]
    lines += ["| " + " | ".join(escape(c) for c in cells) + " |" for cells in rows]
    lines.append("")
    lines += [f"- {line}" for line in legend(result)]
    lines += [f"- {line}" for line in notes.lines()]
    lines.append(f"- {summary_line(result)}")
    return "\n".join(lines) + "\n"
