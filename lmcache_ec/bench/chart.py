"""One PNG of a ``run_bench`` result: a panel per tier, grouped bars per (op, shape).

Bars are median ms per item on a log scale: lmcache-ec, upstream
``ECCacheEngine``, vLLM's ``ECExampleConnector`` and the limit, side by side.
lmcache-ec's bar is outlined green where every target of its row passed and
red where one failed. Skipped tiers get a panel saying why.
"""

from __future__ import annotations

from typing import Any

from .rows import ENGINES

PANELS = ("cpu", "disk", "redis", "s3", "scheduler", "connector", "start-up")
SMALL_PANELS = ("scheduler", "connector", "start-up")
COLORS = {"ours": "#1f77b4", "upstream": "#ff7f0e", "example": "#2ca02c", "limit": "#7f7f7f"}
NAMES = {
    "ours": "lmcache-ec",
    "upstream": "ECCacheEngine (LMCache 0.5.6)",
    "example": "ECExampleConnector (vLLM)",
    "limit": "limit (torch / OS / raw client)",
}
SHORT_SHAPES = {(256, 2560): "G3", (256, 5376): "G3-27B", (1024, 2048): "QVL"}


def _label(row: dict[str, Any]) -> str:
    shape = row.get("shape")
    short = SHORT_SHAPES.get(tuple(shape), f"{shape[0]}x{shape[1]}") if shape else ""
    op = row["op"].replace(" (", "\n(").replace(", ", ",\n")
    return f"{op}\n{short}".strip()


def _panel(row: dict[str, Any]) -> str:
    # Start-up takes seconds: on the CPU tier's axis it would flatten every bar.
    return "start-up" if row["op"].startswith("start-up") else row["tier"]


def draw_chart(result: dict[str, Any], path: str) -> str:
    """Write the chart to ``path`` (PNG); returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    panels = [
        p
        for p in PANELS
        if any(_panel(r) == p for r in result["rows"])
        or any(s["tier"] == p for s in result["skipped"])
    ]
    if not panels:
        panels = ["cpu"]
    # Tiers get a full-width row each; the small panels share the last row.
    wide = [p for p in panels if p not in SMALL_PANELS]
    small = [p for p in panels if p in SMALL_PANELS]
    widths = [sum(1 for r in result["rows"] if _panel(r) == p) for p in wide] or [4]
    rows_count = len(wide) + (1 if small else 0)
    figure = plt.figure(figsize=(min(18, max(10, 2 + 0.8 * max(widths))), 2.8 * rows_count + 0.8))
    grid = figure.add_gridspec(rows_count, max(1, len(small)))
    axes_by_panel = {p: figure.add_subplot(grid[i, :]) for i, p in enumerate(wide)}
    for k, p in enumerate(small):
        axes_by_panel[p] = figure.add_subplot(grid[rows_count - 1, k])
    for panel, ax in axes_by_panel.items():
        rows = [r for r in result["rows"] if _panel(r) == panel]
        skipped = [s for s in result["skipped"] if s["tier"] == panel]
        if not rows:
            reason = skipped[0]["skipped"] if skipped else "not measured"
            ax.text(0.5, 0.5, f"{panel}: skipped — {reason}", ha="center", va="center", wrap=True)
            ax.set_axis_off()
            continue
        width = 0.8 / len(ENGINES)
        for k, engine in enumerate(ENGINES):
            xs, heights, edges = [], [], []
            for i, row in enumerate(rows):
                measured = row.get(engine)
                if not measured or not measured.get("median_ms"):
                    continue
                if measured.get("hits") is not None and measured["hits"] < measured["n"]:
                    continue  # a miss has no meaningful time
                xs.append(i + (k - (len(ENGINES) - 1) / 2) * width)
                heights.append(measured["median_ms"])
                verdicts = [t["pass"] for t in row.get("targets", [])] if engine == "ours" else []
                edges.append(
                    "red" if False in verdicts else "green" if True in verdicts else "none"
                )
            ax.bar(
                xs,
                heights,
                width,
                color=COLORS[engine],
                edgecolor=edges,
                linewidth=1.6,
                label=NAMES[engine],
            )
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(-0.6, max(len(rows), 1 if panel in SMALL_PANELS else 3) - 0.4)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([_label(r) for r in rows], fontsize=7)
        ax.set_ylabel("ms per item (log)")
        title = panel
        if skipped:
            title += " — partly skipped: " + "; ".join(s["skipped"] for s in skipped)[:120]
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(axis="y", which="major", alpha=0.3)
    handles = [Patch(color=COLORS[e], label=NAMES[e]) for e in ENGINES]
    labels = [NAMES[e] for e in ENGINES]
    figure.legend(
        handles, labels, fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, 0.985)
    )
    figure.suptitle(
        "lmcache-ec bench: median ms per item, lower is better "
        "(outline: green = targets met, red = a target missed)",
        fontsize=11,
        y=0.998,
    )
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.7 / figure.get_figheight()))
    figure.savefig(path, dpi=72)
    plt.close(figure)
    return path
