"""``bench serve``'s numbers without a server: the paired ratio's interval, the
verdict, and the per-hit timeline joined from timeline lines (pure functions;
the whole file runs in well under a second)."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from lmcache_ec.bench.paired import Verdict, order_statistic_rank, ratio_interval, verdict
from lmcache_ec.bench.serve_rows import add_targets
from lmcache_ec.bench.serve_timeline import (
    intervals,
    parse_lines,
    request_events,
    summarize_intervals,
)
from lmcache_ec.integration.vllm.timeline import SchedulerTimeline, WorkerTimeline


@pytest.mark.parametrize(
    ("n", "k"),
    # The sign test's table: the largest k with P(Binomial(n, 1/2) < k) <= 2.5 %.
    [(5, 0), (6, 1), (8, 1), (9, 2), (12, 3), (17, 5), (20, 6), (25, 8)],
)
def test_order_statistic_rank_matches_the_sign_test_table(n, k):
    assert order_statistic_rank(n) == k
    if k:  # the interval covers the median with at least 95 %, one rank narrower would not
        below = sum(math.comb(n, i) for i in range(k)) / 2**n
        wider = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
        assert 1 - 2 * below >= 0.95 > 1 - 2 * wider


def test_ratio_interval_on_known_pairs():
    # 12 pair ratios: the median of them, and the 3rd and 10th of them sorted.
    ratios = [1.10, 0.90, 1.20, 1.00, 0.95, 1.05, 1.30, 0.85, 1.15, 0.80, 1.25, 1.02]
    found = ratio_interval(ratios, [1.0] * 12)
    ordered = sorted(ratios)
    assert found.n == 12
    assert found.ratio == pytest.approx(math.sqrt(ordered[5] * ordered[6]))
    assert (found.low, found.high) == pytest.approx((ordered[2], ordered[9]))
    # Scaling both sides alike changes nothing: only the ratio of each pair counts.
    scale = [0.01, 0.1, 10.0, 1e-3] * 3
    scaled = ratio_interval([r * c for r, c in zip(ratios, scale, strict=True)], scale)
    assert (scaled.ratio, scaled.low, scaled.high) == pytest.approx(
        (found.ratio, found.low, found.high)
    )


def test_ratio_interval_needs_enough_positive_pairs():
    assert ratio_interval([1.0] * 5, [2.0] * 5) is None  # 5 pairs cannot give 95 %
    assert ratio_interval([1.0] * 6, [2.0] * 6) is not None
    assert ratio_interval([1.0] * 5 + [0.0], [1.0] * 6) is None
    with pytest.raises(ValueError):
        ratio_interval([1.0, 2.0], [1.0])


def test_constant_ratio_has_a_point_interval():
    found = ratio_interval([2.0, 4.0, 8.0] * 2, [1.0, 2.0, 4.0] * 2)
    assert (found.ratio, found.low, found.high) == pytest.approx((2.0, 2.0, 2.0))


def test_a_stalled_pair_does_not_swing_the_verdict():
    """One pair whose subject landed on a 1 s stall of the machine (40 ms against 1 s):
    the other eleven say 0.8x, and so does the verdict."""
    ours = [0.032, 0.033, 0.031, 0.032, 0.034, 0.033, 0.032, 0.031, 0.033, 0.032, 0.032, 1.0]
    theirs = [0.040] * 12
    found = ratio_interval(ours, theirs)
    assert found.ratio == pytest.approx(0.8, abs=0.02)
    assert found.high < 1.0
    assert verdict(found, 1.0) is Verdict.PASS
    # And a stall on the reference's side does not make it look faster either.
    assert ratio_interval(theirs, ours).low > 1.0


def test_verdict_only_when_the_interval_is_on_one_side():
    below = ratio_interval([0.8, 0.82, 0.79, 0.81, 0.8, 0.83], [1] * 6)
    above = ratio_interval([1.3, 1.32, 1.29, 1.31, 1.3, 1.33], [1] * 6)
    straddling = ratio_interval([0.7, 1.3, 0.8, 1.25, 0.9, 1.2], [1] * 6)
    assert straddling.low < 1.0 < straddling.high
    assert verdict(below, 1.0) is Verdict.PASS
    assert verdict(above, 1.0) is Verdict.FAIL
    assert verdict(straddling, 1.0) is Verdict.INCONCLUSIVE
    assert verdict(None, 1.0) is Verdict.INCONCLUSIVE
    # The same interval is decisive against a target it does not contain.
    assert verdict(straddling, 2.0) is Verdict.PASS


def _row(subject, samples, pattern="cold restart", mode="lone"):
    return {
        "subject": subject,
        "pattern": pattern,
        "mode": mode,
        "repeats": sum(s["repeat"] for s in samples),
        "samples": samples,
    }


def test_targets_pair_the_same_image_and_the_floor_after_it():
    mine = [
        {"image": i, "repeat": True, "ttft_s": 0.040 + i / 1000, "floor_s": 0.040 + i / 1000}
        for i in range(1, 7)
    ]
    mine.append({"image": 7, "repeat": False, "ttft_s": 0.9, "floor_s": None})
    theirs = [{**s, "ttft_s": s["ttft_s"] * 1.25, "floor_s": 0.04} for s in mine]
    rows = [_row("example", theirs), _row("lmcache-disk", mine)]
    targets = {t["text"]: t for t in add_targets(rows)}
    floor = targets["hit TTFT ≤ 1.1x text floor"]
    versus = targets["hit TTFT ≤ ECExampleConnector's"]
    assert floor["n"] == versus["n"] == 6  # the miss is in neither
    assert floor["low"] <= floor["value"] <= floor["high"]
    assert floor["verdict"] == "pass" and floor["pass"] is True
    assert versus["value"] == pytest.approx(0.8, abs=1e-3)
    assert versus["verdict"] == "pass" and versus["high"] < 1.0
    # The example's rows carry no targets of their own.
    assert rows[0]["targets"] == []


def test_targets_inconclusive_when_the_interval_holds_the_target():
    mine = [
        {"image": i, "repeat": True, "ttft_s": t, "floor_s": 0.04}
        for i, t in enumerate((0.035, 0.06, 0.04, 0.055, 0.038, 0.058))
    ]
    theirs = [{**s, "ttft_s": 0.047} for s in mine]
    rows = [_row("example", theirs), _row("lmcache-disk", mine)]
    versus = next(t for t in add_targets(rows) if "Example" in t["text"])
    assert versus["low"] < 1.0 < versus["high"]
    assert versus["verdict"] == "inconclusive" and versus["pass"] is None


def test_timeline_lines_from_both_sides_join_into_intervals(tmp_path):
    path = str(tmp_path / "timeline.jsonl")
    scheduler, worker = SchedulerTimeline(path), WorkerTimeline(path, 0)

    class Feature:
        identifier = "a" * 64

    class Request:
        request_id = "chatcmpl-abc-1234abcd"  # vLLM: the client's id, "-", 8 characters
        arrival_time = 0.0
        mm_features = [Feature()]

    scheduler.seen(Request.request_id)
    for event in ("lookup", "stage_sent"):
        scheduler.item(Feature.identifier, event)
    worker.item(Feature.identifier, "read")
    scheduler.item(Feature.identifier, "staged")
    scheduler.item(Feature.identifier, "scheduled")
    worker.item(Feature.identifier, "loaded")
    scheduler.finished(Request())
    scheduler.close()
    worker.close()
    lines = (tmp_path / "timeline.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line) for line in lines)
    parsed = parse_lines([*lines, '{"request": "cut sh'])  # a torn line is skipped
    record = parsed.requests["chatcmpl-abc"]
    Request.arrival_time = record["seen"] - 0.002
    parsed.requests["chatcmpl-abc"]["arrival"] = Request.arrival_time
    sent = Request.arrival_time - 0.001
    events = request_events(parsed, "chatcmpl-abc", sent, sent + 1.0)
    order = ["sent", "arrival", "seen", "lookup", "stage_sent", "read", "staged"]
    order += ["scheduled", "loaded", "first_token"]
    assert list(intervals(events)) == [f"{a}→{b}" for a, b in itertools.pairwise(order)]
    assert all(seconds >= 0 for seconds in intervals(events).values())
    assert sum(intervals(events).values()) == pytest.approx(1.0)
    # A request the server wrote nothing for has the client's interval only.
    assert list(intervals(request_events(parsed, "other", 0.0, 0.05))) == ["sent→first_token"]


def test_item_events_restart_at_each_lookup_and_precede_no_request(tmp_path):
    path = tmp_path / "t.jsonl"
    scheduler = SchedulerTimeline(str(path))
    scheduler.item("x", "lookup")
    scheduler.item("x", "staged")

    class Feature:
        identifier = "x"

    class Request:
        request_id = "r-12345678"
        arrival_time = 0.0
        mm_features = [Feature()]

    scheduler.seen("r-12345678")  # after the first fetch: its events are not this request's
    scheduler.item("x", "lookup")
    scheduler.finished(Request())
    scheduler.finished(Request())  # written once
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 1
    assert set(records[0]["items"]["x"]) == {"lookup"}


def test_summary_gives_median_and_p99_per_interval():
    found = summarize_intervals([{"a→b": 0.001 * k, "b→c": 0.002} for k in range(1, 102)])
    assert list(found) == ["a→b", "b→c"]
    assert found["a→b"]["p50_ms"] == pytest.approx(51.0)
    assert found["a→b"]["p99_ms"] == pytest.approx(100.0)
    assert found["b→c"] == {"p50_ms": 2.0, "p99_ms": 2.0, "n": 101}
