"""Ratios and the product's targets, evaluated on the rows of one run.

Convention: a ratio is ``baseline median / ours median`` — a speed ratio,
above 1 when lmcache-ec is faster. Against ``limit`` it is the fraction of
the physical limit reached (usually below 1). A baseline that missed (fewer
hits than calls) or could not run (``na``) gives no ratio.

A target may name references: each a ratio between two other cells of the
same row, measured in the same run, that says how far the target can be
reached at all (a bound) or what the row reads like for like. They are shown
beside the verdict and never change it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .rows import OURS

RATIO_BASELINES = ("upstream", "example", "limit", "cpu_only", "verified")


@dataclass(frozen=True)
class Reference:
    text: str  # shown beside the verdict; "{ratio}" is the reference's value
    numerator: str  # the row cells whose medians make the ratio
    denominator: str

    def show(self, value: float) -> str:
        return self.text.format(ratio=f"{value:.2f}x")


REFERENCES = {
    # A get that returns a private tensor copies at least once; upstream's get is one copy too.
    "copy_bound": Reference("bound {ratio}: one copy", "upstream", "limit"),
    # ECCache's CPU tier is LMCache's CPU backend: its lookup, hold and release come first.
    "backend_bound": Reference("bound {ratio}: LMCache's CPU read", "limit", "cpu_read"),
    "verify_bound": Reference("bound {ratio}: readinto + xxh3", "limit", "verified"),
    # The example returns an unverified tensor over a file mapping; a disk read that
    # copies and verifies costs at least readinto + xxh3.
    "example_verify_bound": Reference("bound {ratio}: readinto + xxh3", "example", "verified"),
    # The example's bytes arrive on the result's first read: each engine's result read once.
    "read_once": Reference("read once each: {ratio}", "example_read_once", "ours_read_once"),
    "example_read_once_bound": Reference(
        "bound {ratio}", "example_read_once", "verified_read_once"
    ),
    # get_many below the CPU tier: upstream against the bare read, one item at a time.
    "item_loop": Reference("the limit item by item: {ratio}", "upstream", "limit"),
    "verified_loop": Reference("readinto + xxh3 item by item: {ratio}", "upstream", "verified"),
}
CONVENTION = (
    "ratio = baseline median / lmcache-ec median (a speed ratio: >1 means lmcache-ec is "
    "faster; against the limit, the fraction of it reached). Times are per item."
)


@dataclass(frozen=True)
class Target:
    text: str
    tiers: tuple[str, ...]
    ops: tuple[str, ...]  # exact op names; a trailing "*" matches a prefix
    baseline: str | None = None  # the ratio compared with min_ratio
    min_ratio: float | None = None
    max_ms: float | None = None  # ours' median, when there is no baseline
    references: tuple[str, ...] = ()  # keys of REFERENCES

    def applies(self, row: dict[str, Any]) -> bool:
        if row["tier"] not in self.tiers:
            return False
        return any(
            row["op"].startswith(op[:-1]) if op.endswith("*") else row["op"] == op
            for op in self.ops
        )

    def evaluate(self, row: dict[str, Any]) -> dict[str, Any]:
        ours = row[OURS]
        value: float | None
        if self.baseline is not None:
            value = row["ratios"].get(self.baseline)
            threshold = self.min_ratio
        else:
            value = ours.get("median_ms")
            threshold = self.max_ms
        passed: bool | None
        if ours.get("hits") is not None and ours["hits"] < ours["n"]:
            passed = False  # a fast miss is not a fast read
        elif value is None or threshold is None:
            passed = None
        elif self.baseline is not None:
            passed = value >= threshold
        else:
            passed = value <= threshold
        return {
            "text": self.text,
            "baseline": self.baseline,
            "threshold": threshold,
            "kind": "min_ratio" if self.baseline is not None else "max_ms",
            "value": value,
            "pass": passed,
            "references": {name: row["ratios"].get(name) for name in self.references},
        }


SCHEDULER_OPS = (
    "has_cache_item, ready",
    "has_cache_item, unknown",
    "tier lookup, first sight",
    "tier lookup, answered",
)

TARGETS = (
    Target("start-up ≥ 5x upstream's", ("cpu",), ("start-up*",), "upstream", min_ratio=5.0),
    Target(
        "get ≥ 0.8x a raw clone()",
        ("cpu",),
        ("get",),
        "limit",
        min_ratio=0.8,
        references=("backend_bound",),
    ),
    Target(
        "get ≥ 1.5x upstream",
        ("cpu",),
        ("get",),
        "upstream",
        min_ratio=1.5,
        references=("copy_bound",),
    ),
    Target(
        "get ≥ 0.5x a page-cache read",
        ("disk",),
        ("get",),
        "limit",
        min_ratio=0.5,
        references=("verify_bound",),
    ),
    Target(
        "get ≥ 0.9x ECExampleConnector",
        ("disk",),
        ("get",),
        "example",
        min_ratio=0.9,
        references=("example_verify_bound", "read_once", "example_read_once_bound"),
    ),
    Target(
        "save off the caller's path: put ≥ 0.8x the same put with no tier below",
        ("disk", "redis", "s3"),
        ("put",),
        "cpu_only",
        min_ratio=0.8,
    ),
    Target("get ≥ 0.7x redis-py GET", ("redis",), ("get",), "limit", min_ratio=0.7),
    Target("get ≥ 0.7x boto3 get_object", ("s3",), ("get",), "limit", min_ratio=0.7),
    Target(
        "get_many ≥ 2x upstream's per-item loop",
        ("cpu",),
        ("get_many",),
        "upstream",
        min_ratio=2.0,
        references=("copy_bound",),
    ),
    Target(
        "get_many ≥ 2x upstream's per-item loop",
        ("disk",),
        ("get_many",),
        "upstream",
        min_ratio=2.0,
        references=("verified_loop",),
    ),
    Target(
        "get_many ≥ 2x upstream's per-item loop",
        ("redis", "s3"),
        ("get_many",),
        "upstream",
        min_ratio=2.0,
        references=("item_loop",),
    ),
    Target("≤ 10 µs per item", ("scheduler",), SCHEDULER_OPS, max_ms=0.010),
    Target("returns in ≤ 100 µs", ("connector",), ("save_caches",), max_ms=0.100),
)


def _median(cell: dict[str, Any] | None) -> float | None:
    """A cell's median, or None when it could not run or missed."""
    if not cell or "na" in cell:
        return None
    if cell.get("hits") is not None and cell["hits"] < cell["n"]:
        return None
    return cell.get("median_ms") or None


def ratios(row: dict[str, Any]) -> dict[str, float | None]:
    """Each baseline's median over ours, then the references of the row's targets."""
    ours = row[OURS].get("median_ms")
    out: dict[str, float | None] = {}
    for name in RATIO_BASELINES:
        base = row.get(name)
        if not base or "na" in base:
            continue
        median = _median(base)
        out[name] = median / ours if median and ours else None
    for name in dict.fromkeys(n for t in TARGETS if t.applies(row) for n in t.references):
        reference = REFERENCES[name]
        if reference.numerator in row and reference.denominator in row:
            top, bottom = _median(row[reference.numerator]), _median(row[reference.denominator])
            out[name] = top / bottom if top and bottom else None
    return out


def annotate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``ratios`` (unless ``merge_repeats`` did) and ``targets`` to every
    measured row; returns the target results."""
    results = []
    for row in rows:
        if "ratios" not in row:
            row["ratios"] = ratios(row)
        row["targets"] = [t.evaluate(row) for t in TARGETS if t.applies(row)]
        for target in row["targets"]:
            results.append({"tier": row["tier"], "op": row["op"], "shape": row["shape"], **target})
    return results
