"""``bench serve`` results rendered: the console table, Markdown and the chart.

The rows come from ``serve.run_serve``; nothing here measures.
"""

from __future__ import annotations

from typing import Any

from .paired import min_pairs
from .serve_rows import SUBJECTS
from .serve_timeline import EVENTS


def verdict_text(row: dict[str, Any]) -> str:
    """Each target: verdict, paired ratio and its 95 % interval, pairs (or rounds)."""
    texts = []
    for t in row.get("targets", []):
        if t["value"] is None:
            texts.append(f"{t['verdict'].upper()} ({_no_interval(t)}): {t['text']}")
        else:
            texts.append(
                f"{t['verdict'].upper()} {t['value']}x [{t['low']}, {t['high']}] "
                f"{_count(t)}: {t['text']}"
            )
    return "; ".join(texts)


def _count(t: dict[str, Any]) -> str:
    unit = t.get("unit", "pairs")
    named = unit if t["n"] != 1 else unit[:-1]
    # A concurrent round counts once: say how many pairs its rounds hold.
    return f"n={t['n']} {named}" + (f" ({t['pairs']} pairs)" if unit == "rounds" else "")


def _no_interval(t: dict[str, Any]) -> str:
    if not t.get("pairs", t["n"]):
        return "no pairs"
    if t.get("no_interval", "too few") == "too few":
        needed = t.get("needed", 6)
        return f"{_count(t)}; {needed} needed for a 95 % interval"
    return f"{_count(t)}; no interval: {t['no_interval']}"


def outcome(row: dict[str, Any]) -> str | None:
    """The row's colour: red when a target failed, green only when every one passed."""
    verdicts = [t["pass"] for t in row.get("targets", [])]
    if False in verdicts:
        return "red"
    return "green" if verdicts and all(v is True for v in verdicts) else None


def timeline_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The intervals any row has, in event order."""
    names = {name for row in rows for name in row.get("timeline") or {}}
    order = {name: i for i, name in enumerate(EVENTS)}
    return sorted(names, key=lambda n: tuple(order[e] for e in n.split("→")))


def timeline_cells(row: dict[str, Any], columns: list[str]) -> list[str]:
    cells = [row["label"], row["pattern"], row["mode"]]
    for name in columns:
        found = (row.get("timeline") or {}).get(name)
        cells.append("-" if found is None else f"{found['p50_ms']:.1f} / {found['p99_ms']:.1f}")
    return cells


def timeline_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows with a timeline of their hits (rows with repeats, of subjects that record)."""
    return [r for r in result["rows"] if r.get("timeline") and r["repeats"]]


TIMELINE_NOTE = (
    "per-hit timeline: median / p99 ms of each interval over the row's repeat requests; "
    "sent and first_token from the client, arrival from vLLM's request, the rest from the "
    "connector (lmcache-ec: ec.timeline_path; ECExampleConnector: the same hooks in a "
    "subclass that only records). An interval joins consecutive events a subject has."
)


COLUMNS = (
    ("subject", "label"),
    ("pattern", "pattern"),
    ("mode", "mode"),
    ("n", "requests"),
    ("hits/repeats", None),
    ("TTFT p50 ms", "ttft_p50_ms"),
    ("p99 ms", "ttft_p99_ms"),
    ("hit p50 ms", "hit_ttft_p50_ms"),
    ("miss p50 ms", "miss_ttft_p50_ms"),
    ("floor ms", "floor_ttft_p50_ms"),
    ("hit/floor", "hit_over_floor"),
    ("req/s", "requests_per_s"),
    ("enc s saved", "encoder_s_saved"),
    ("targets", None),
)


def table_cells(row: dict[str, Any]) -> list[str]:
    cells = []
    for header, key in COLUMNS:
        if header == "hits/repeats":
            mark = "" if row["hits_source"] == "counter" or not row["hits"] else "*"
            cells.append(f"{row['hits']}{mark}/{row['repeats']}")
        elif header == "targets":
            cells.append(verdict_text(row))
        else:
            value = row[key]
            cells.append(
                "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
            )
    return cells


NOTES = (
    "TTFT: streamed, temperature 0, request sent -> first token; p50/p99 over the row's requests.",
    "hit p50: requests for an image sent before; floor: p50 of a text-only prompt of the same "
    "token count, sent right after each repeat (and every other round without one) on the "
    "same server, same mode.",
    "targets: the paired ratio (median over pairs) with its 95 % sign-test interval (order "
    "statistics of the pair ratios); hit/floor pairs a hit with the floor sent right after "
    "it, vs ECExampleConnector pairs the same image sent to both in turn; PASS/FAIL only "
    "when the whole interval is on one side of the target, else INCONCLUSIVE. Concurrent "
    "rows count a round once (the median of its pair ratios: its requests share the "
    "server's steps), so they need 6 rounds for an interval, lone rows 6 pairs.",
    "servers take turns with a pause between two servers (settle_s): vLLM's CPU workers poll "
    "their queues for 1 s after each step, which would slow the next server on the same core.",
    "hits: lmcache-ec's loads counter (vllm:lmcache_ec_loads_total); * ECExampleConnector has "
    "no counter: every repeat assumed a hit.",
    "req/s: lone = requests / summed request time; concurrent = requests / summed round "
    "wall time (a round: in_flight requests at once, to one server).",
    "enc s saved: (miss TTFT p50 at reuse 0 % - hit TTFT p50) x hits, same subject and mode.",
    "cold restart: a fresh server on the first one's store; 2nd instance: a second lmcache-ec "
    "server on the same Redis while the first runs (compared with ECExampleConnector's cold "
    "restart). No restart for 'no connector': it has nothing to load.",
)


def markdown(result: dict[str, Any]) -> str:
    headers = [h for h, _ in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in result["rows"]:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in table_cells(row)) + " |")
    lines.append("")
    lines += [f"- {note}" for note in NOTES]
    lines.append(f"- {summary_line(result)}")
    timed = timeline_rows(result)
    if timed:
        columns = timeline_columns(timed)
        headers = ["subject", "pattern", "mode", *columns]
        lines += [
            "",
            "| " + " | ".join(headers) + " |",
            "|" + "|".join("---" for _ in headers) + "|",
        ]
        lines += ["| " + " | ".join(timeline_cells(row, columns)) + " |" for row in timed]
        lines += ["", f"- {TIMELINE_NOTE}"]
    return "\n".join(lines) + "\n"


def summary_line(result: dict[str, Any]) -> str:
    targets = result["targets"]
    verdicts = [t["verdict"] for t in targets]
    # A target without an interval is inconclusive too, but for want of pairs.
    few = sum(t["value"] is None and t.get("no_interval", "too few") == "too few" for t in targets)
    other = sum(t["value"] is None for t in targets) - few
    contains = verdicts.count("inconclusive") - few - other
    return (
        f"targets: {verdicts.count('pass')} pass, {verdicts.count('fail')} fail, "
        f"{contains} inconclusive (95 % interval of the paired ratio contains the target), "
        f"{few} too few pairs ({min_pairs()} needed for a 95 % interval; concurrent rows: "
        f"{min_pairs()} rounds)"
        + (f", {other} without an interval (a request without a first token)" if other else "")
        + f" — {result['elapsed_s']} s on {result['machine']['cpus']} CPUs"
        + (f"; STOPPED EARLY: {result['stopped']}" if result.get("stopped") else "")
    )


def print_table(result: dict[str, Any], console: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    if not console.is_terminal:
        console = Console(width=220, highlight=False)
    table = Table(title="bench serve: TTFT per subject and pattern", title_justify="left")
    for header, _ in COLUMNS:
        table.add_column(
            header, justify="left" if header in ("subject", "pattern", "mode") else "right"
        )
    for row in result["rows"]:
        cells = table_cells(row)
        color = outcome(row)
        cells[-1] = f"[{color}]{cells[-1]}[/]" if color and cells[-1] else cells[-1]
        table.add_row(*cells)
    console.print(table)
    for note in NOTES:
        console.print(f"- {note}", markup=False)
    console.print(summary_line(result))
    timed = timeline_rows(result)
    if timed:
        columns = timeline_columns(timed)
        table = Table(title="per-hit timeline, ms (median / p99)", title_justify="left")
        for header in ("subject", "pattern", "mode", *columns):
            table.add_column(
                header, justify="left" if header in ("subject", "pattern", "mode") else "right"
            )
        for row in timed:
            table.add_row(*timeline_cells(row, columns))
        console.print(table)
        console.print(f"- {TIMELINE_NOTE}", markup=False)


def draw_chart(result: dict[str, Any], path: str) -> str:
    """TTFT p50 per pattern (x) and subject (bars), one panel per mode; floor dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in ("lone", "concurrent") if any(r["mode"] == m for r in result["rows"])]
    figure, axes = plt.subplots(len(modes), 1, figsize=(11, 3.6 * len(modes)), squeeze=False)
    subjects = [s for s in SUBJECTS if any(r["subject"] == s for r in result["rows"])]
    colors = dict(zip(SUBJECTS, ("#7f7f7f", "#2ca02c", "#1f77b4", "#9467bd"), strict=True))
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        rows = [r for r in result["rows"] if r["mode"] == mode]
        patterns = list(dict.fromkeys(r["pattern"] for r in rows))
        width = 0.8 / len(subjects)
        for k, subject in enumerate(subjects):
            for i, pattern in enumerate(patterns):
                row = next(
                    (r for r in rows if r["subject"] == subject and r["pattern"] == pattern), None
                )
                if row is None or not row["ttft_p50_ms"]:
                    continue
                edge = outcome(row) or "none"
                x = i + (k - (len(subjects) - 1) / 2) * width
                ax.bar(
                    x,
                    row["ttft_p50_ms"],
                    width,
                    color=colors[subject],
                    edgecolor=edge,
                    linewidth=1.6,
                    label=SUBJECTS[subject] if i == 0 else None,
                )
                if row["floor_ttft_p50_ms"]:
                    ax.hlines(
                        row["floor_ttft_p50_ms"],
                        x - width / 2,
                        x + width / 2,
                        colors="black",
                        linestyles="dashed",
                        linewidth=1,
                    )
        ax.set_yscale("log")
        ax.set_xticks(range(len(patterns)))
        ax.set_xticklabels(patterns, fontsize=8)
        ax.set_ylabel("TTFT p50, ms (log)")
        ax.set_title(
            f"{mode} requests (dashed: text-only floor on the same server)", fontsize=10, loc="left"
        )
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    figure.suptitle(
        "lmcache-ec bench serve: TTFT p50, lower is better "
        "(outline: green = targets met, red = a target missed)",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=72)
    plt.close(figure)
    return path


__all__ = ["draw_chart", "markdown", "print_table"]
