"""``bench serve``'s measurements as rows: what each request gave (``Sample``,
``Block``), each block's row (``summarize``) and the paired-ratio targets
(``add_targets``). Nothing here starts a server; ``serve.py`` measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .paired import Verdict, ratio_interval, verdict

SUBJECTS = {
    "none": "no connector",
    "example": "ECExampleConnector (disk)",
    "lmcache-disk": "lmcache-ec (disk)",
    "lmcache-redis": "lmcache-ec (Redis)",
}
LMCACHE = ("lmcache-disk", "lmcache-redis")
FLOOR_MAX = 1.1  # target: hit TTFT / floor
EXAMPLE_MAX = 1.0  # target: hit TTFT / ECExampleConnector's


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class Sample:
    """One image request: what was asked, when, and its paired text-only floor."""

    image: int
    repeat: bool
    ttft: float
    request_id: str | None = None
    sent_at: float = 0.0
    first_token_at: float = 0.0
    floor: float | None = None  # TTFT of the text prompt sent right after it, same server


@dataclass
class Block:
    """One (subject, pattern, mode): what was sent and what came back."""

    subject: str
    pattern: str
    mode: str
    samples: list[Sample] = field(default_factory=list)  # in send order, the same on every server
    floor_ttft: list[float] = field(default_factory=list)
    busy_s: float = 0.0  # lone: summed request times; concurrent: summed round wall times
    counters: dict[str, float] = field(default_factory=dict)
    timeline: dict[str, dict[str, float]] = field(default_factory=dict)  # interval -> p50/p99

    @property
    def ttft(self) -> list[float]:
        return [s.ttft for s in self.samples]

    @property
    def hit_ttft(self) -> list[float]:  # requests for a repeat image
        return [s.ttft for s in self.samples if s.repeat]

    @property
    def miss_ttft(self) -> list[float]:
        return [s.ttft for s in self.samples if not s.repeat]


def summarize(block: Block, floor: float | None, miss_ref: float | None) -> dict[str, Any]:
    repeats = len(block.hit_ttft)
    if block.subject in LMCACHE:
        hits = int(block.counters.get("loads", 0))
    else:
        hits = repeats if block.subject == "example" else 0
    hit_p50 = pct(block.hit_ttft, 50)
    row = {
        "subject": block.subject,
        "label": SUBJECTS[block.subject],
        "pattern": block.pattern,
        "mode": block.mode,
        "requests": len(block.ttft),
        "repeats": repeats,
        "hits": hits,
        "hits_source": "counter" if block.subject in LMCACHE else "assumed",
        "encodes": int(block.counters["saves"]) if block.subject in LMCACHE else None,
        "ttft_p50_ms": _ms(pct(block.ttft, 50)),
        "ttft_p99_ms": _ms(pct(block.ttft, 99)),
        "hit_ttft_p50_ms": _ms(hit_p50),
        "miss_ttft_p50_ms": _ms(pct(block.miss_ttft, 50)),
        "floor_ttft_p50_ms": _ms(floor),
        "requests_per_s": round(len(block.ttft) / block.busy_s, 3) if block.busy_s else None,
        "hit_over_floor": round(hit_p50 / floor, 3) if hit_p50 and floor else None,
        "encoder_s_saved": (
            round(max(miss_ref - hit_p50, 0.0) * hits, 3)
            if hits and hit_p50 is not None and miss_ref is not None
            else 0.0
        ),
        "counters": {k: round(v, 6) for k, v in block.counters.items()},
        "ttft_ms": [round(t * 1000, 2) for t in block.ttft],
        "timeline": block.timeline,
        "samples": [
            {"image": s.image, "repeat": s.repeat, "ttft_s": s.ttft, "floor_s": s.floor}
            for s in block.samples
        ],
    }
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def target(text: str, limit: float, subject: list[float], reference: list[float]) -> dict:
    """A paired-ratio target: the ratio, its 95 % interval and the verdict."""
    interval = ratio_interval(subject, reference)
    found = verdict(interval, limit)
    return {
        "text": text,
        "limit": limit,
        "value": None if interval is None else round(interval.ratio, 3),
        "low": None if interval is None else round(interval.low, 3),
        "high": None if interval is None else round(interval.high, 3),
        "n": len(subject),
        "verdict": found.value,
        "pass": {Verdict.PASS: True, Verdict.FAIL: False}.get(found),
    }


def add_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark lmcache-ec rows with hits: hit ≤ 1.1x its paired text floor, hit ≤
    ECExampleConnector's for the same image sent back to back (paired ratios)."""
    example = {(r["pattern"], r["mode"]): r for r in rows if r["subject"] == "example"}
    results = []
    for row in rows:
        row["targets"] = []
        if row["subject"] not in LMCACHE or not row["repeats"]:
            continue
        floored = [s for s in row["samples"] if s["repeat"] and s["floor_s"]]
        row["targets"].append(
            target(
                f"hit TTFT ≤ {FLOOR_MAX}x text floor",
                FLOOR_MAX,
                [s["ttft_s"] for s in floored],
                [s["floor_s"] for s in floored],
            )
        )
        pattern = row["pattern"] if row["pattern"] != "2nd instance" else "cold restart"
        other = example.get((pattern, row["mode"]))
        pairs = []
        if other is not None:  # the same image, sent to both back to back
            pairs = [
                (mine["ttft_s"], theirs["ttft_s"])
                for mine, theirs in zip(row["samples"], other["samples"], strict=False)
                if mine["repeat"] and theirs["repeat"] and mine["image"] == theirs["image"]
            ]
        versus = target(
            "hit TTFT ≤ ECExampleConnector's",
            EXAMPLE_MAX,
            [a for a, _ in pairs],
            [b for _, b in pairs],
        )
        row["vs_example"] = versus["value"] if other is not None else None
        if other is not None:
            row["targets"].append(versus)
        for found in row["targets"]:
            results.append(
                {"subject": row["subject"], "pattern": row["pattern"], "mode": row["mode"], **found}
            )
    return results


__all__ = ["LMCACHE", "SUBJECTS", "Block", "Sample", "add_targets", "pct", "summarize"]
