"""``bench serve``'s measurements as rows: what each request gave (``Sample``,
``Block``), each block's row (``summarize``) and the paired-ratio targets
(``add_targets``). Nothing here starts a server; ``serve.py`` measures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .paired import Verdict, min_pairs, ratio_interval, verdict

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
    round: int | None = None  # its round in the block (lone: one request a round)


@dataclass
class Block:
    """One (subject, pattern, mode): what was sent and what came back."""

    subject: str
    pattern: str
    mode: str
    index: int = 0  # the block of requests it took part in: only rows of one block pair up
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
        "block": block.index,
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
            {
                "image": s.image,
                "repeat": s.repeat,
                "ttft_s": s.ttft,
                "floor_s": s.floor,
                "round": s.round,
            }
            for s in block.samples
        ],
    }
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


Pair = tuple[float, float, int]  # subject's and reference's seconds, and their unit


def units(pairs: list[Pair]) -> list[float]:
    """One ratio per unit, the median of its pairs' ratios: the concurrent requests
    of a round share one server's steps (their ratios move together), so the sign
    test may only count the round once."""
    ratios: dict[int, list[float]] = {}
    for mine, theirs, unit in pairs:
        ratios.setdefault(unit, []).append(mine / theirs)
    return [statistics.median(found) for found in ratios.values()]


def target(text: str, limit: float, pairs: list[Pair], mode: str) -> dict:
    """A paired-ratio target: the ratio, its 95 % interval over the units (pairs;
    rounds when concurrent), and the verdict."""
    n = len({unit for *_, unit in pairs})
    needed = min_pairs()
    positive = all(mine > 0 and theirs > 0 for mine, theirs, _ in pairs)
    interval = ratio_interval(units(pairs), [1.0] * n) if positive else None
    found = verdict(interval, limit)
    missing = None  # why there is no interval: the verdict then says nothing of the ratio
    if interval is None:
        missing = "too few" if n < needed else "a request without a first token"
    return {
        "text": text,
        "limit": limit,
        "value": None if interval is None else round(interval.ratio, 3),
        "low": None if interval is None else round(interval.low, 3),
        "high": None if interval is None else round(interval.high, 3),
        "n": n,
        "unit": "rounds" if mode == "concurrent" else "pairs",
        "pairs": len(pairs),
        "needed": needed,
        "no_interval": missing,
        "verdict": found.value,
        "pass": {Verdict.PASS: True, Verdict.FAIL: False}.get(found),
    }


def _unit(sample: dict[str, Any], position: int, mode: str) -> int:
    found = sample.get("round") if mode == "concurrent" else None
    return position if found is None else found


def _block_key(row: dict[str, Any]) -> tuple[Any, str, str]:
    # The 2nd instance runs beside the example's cold restart, in the same block.
    pattern = row["pattern"] if row["pattern"] != "2nd instance" else "cold restart"
    return row.get("block"), pattern, row["mode"]


def add_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark lmcache-ec rows with hits: hit ≤ 1.1x its paired text floor, hit ≤
    ECExampleConnector's for the same image sent back to back in the same block
    (paired ratios)."""
    example = {_block_key(r): r for r in rows if r["subject"] == "example"}
    results = []
    for row in rows:
        row["targets"] = []
        if row["subject"] not in LMCACHE or not row["repeats"]:
            continue
        mode = row["mode"]
        floored = [
            (s["ttft_s"], s["floor_s"], _unit(s, i, mode))
            for i, s in enumerate(row["samples"])
            if s["repeat"] and s["floor_s"]
        ]
        row["targets"].append(
            target(f"hit TTFT ≤ {FLOOR_MAX}x text floor", FLOOR_MAX, floored, mode)
        )
        other = example.get(_block_key(row))
        pairs = []
        if other is not None:  # the same image, sent to both back to back
            pairs = [
                (mine["ttft_s"], theirs["ttft_s"], _unit(mine, i, mode))
                for i, (mine, theirs) in enumerate(
                    zip(row["samples"], other["samples"], strict=False)
                )
                if mine["repeat"] and theirs["repeat"] and mine["image"] == theirs["image"]
            ]
        versus = target("hit TTFT ≤ ECExampleConnector's", EXAMPLE_MAX, pairs, mode)
        row["vs_example"] = versus["value"] if other is not None else None
        if other is not None:
            row["targets"].append(versus)
        for found in row["targets"]:
            results.append(
                {"subject": row["subject"], "pattern": row["pattern"], "mode": row["mode"], **found}
            )
    return results


__all__ = ["LMCACHE", "SUBJECTS", "Block", "Sample", "add_targets", "pct", "summarize"]
