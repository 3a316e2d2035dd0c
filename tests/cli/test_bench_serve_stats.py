"""``bench serve``'s numbers without a server: the paired ratio's interval, the
verdict, and the per-hit timeline joined from timeline lines (pure functions;
the whole file runs in well under a second)."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from lmcache_ec.bench.paired import Verdict, ratio_interval, t_quantile, verdict
from lmcache_ec.bench.serve import add_targets
from lmcache_ec.bench.serve_timeline import (
    intervals,
    parse_lines,
    request_events,
    summarize_intervals,
)
from lmcache_ec.integration.vllm.timeline import SchedulerTimeline, WorkerTimeline


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.706205), (4, 2.776445), (9, 2.262157), (29, 2.045230), (1000, 1.962339)],
)
def test_t_quantile_matches_the_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-5)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-5)


def test_ratio_interval_on_known_pairs():
    # Pair ratios 1.1, 0.9, 1.2, 1.0: logs have mean m and sd s; the interval is
    # exp(m ± t(0.975, 3) s / 2), worked out here by hand.
    logs = [math.log(r) for r in (1.1, 0.9, 1.2, 1.0)]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    half = 3.182446 * sd / 2
    found = ratio_interval([1.1, 0.9, 1.2, 1.0], [1.0, 1.0, 1.0, 1.0])
    assert found.n == 4
    assert found.ratio == pytest.approx(math.exp(mean))
    assert found.low == pytest.approx(math.exp(mean - half), rel=1e-6)
    assert found.high == pytest.approx(math.exp(mean + half), rel=1e-6)
    # Scaling both sides alike changes nothing: only the ratio of each pair counts.
    scaled = ratio_interval([0.011, 0.09, 12.0, 1e-3], [0.01, 0.1, 10.0, 1e-3])
    assert (scaled.ratio, scaled.low, scaled.high) == pytest.approx(
        (found.ratio, found.low, found.high)
    )


def test_ratio_interval_needs_two_positive_pairs():
    assert ratio_interval([1.0], [2.0]) is None
    assert ratio_interval([1.0, 0.0], [1.0, 1.0]) is None
    with pytest.raises(ValueError):
        ratio_interval([1.0, 2.0], [1.0])


def test_constant_ratio_has_a_point_interval():
    found = ratio_interval([2.0, 4.0, 8.0], [1.0, 2.0, 4.0])
    assert (found.ratio, found.low, found.high) == pytest.approx((2.0, 2.0, 2.0))


def test_verdict_only_when_the_interval_is_on_one_side():
    below = ratio_interval([0.8, 0.82, 0.79, 0.81], [1, 1, 1, 1])
    above = ratio_interval([1.3, 1.32, 1.29, 1.31], [1, 1, 1, 1])
    straddling = ratio_interval([0.7, 1.3, 0.8, 1.25], [1, 1, 1, 1])
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
        {"image": 1, "repeat": True, "ttft_s": 0.040, "floor_s": 0.040},
        {"image": 2, "repeat": True, "ttft_s": 0.042, "floor_s": 0.041},
        {"image": 3, "repeat": True, "ttft_s": 0.041, "floor_s": 0.041},
        {"image": 4, "repeat": False, "ttft_s": 0.9, "floor_s": None},
    ]
    theirs = [
        {"image": 1, "repeat": True, "ttft_s": 0.050, "floor_s": 0.04},
        {"image": 2, "repeat": True, "ttft_s": 0.052, "floor_s": 0.04},
        {"image": 3, "repeat": True, "ttft_s": 0.051, "floor_s": 0.04},
        {"image": 4, "repeat": False, "ttft_s": 0.9, "floor_s": None},
    ]
    rows = [_row("example", theirs), _row("lmcache-disk", mine)]
    targets = {t["text"]: t for t in add_targets(rows)}
    floor = targets["hit TTFT ≤ 1.1x text floor"]
    versus = targets["hit TTFT ≤ ECExampleConnector's"]
    assert floor["n"] == versus["n"] == 3  # the miss is in neither
    assert floor["low"] <= floor["value"] <= floor["high"]
    assert floor["verdict"] == "pass" and floor["pass"] is True
    assert versus["value"] == pytest.approx(0.804, abs=1e-3)
    assert versus["verdict"] == "pass" and versus["high"] < 1.0
    # The example's rows carry no targets of their own.
    assert rows[0]["targets"] == []


def test_targets_inconclusive_when_the_interval_holds_the_target():
    mine = [
        {"image": i, "repeat": True, "ttft_s": t, "floor_s": 0.04}
        for i, t in enumerate((0.035, 0.06, 0.04, 0.055))
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
