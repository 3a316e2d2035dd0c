"""``bench serve``'s statistics say only what the samples support, and a failed request
is an error, not a traceback: a concurrent round counts once in the sign test (its
requests share one server's steps), only rows of one block pair up, a per-hit timeline
takes only its own request's worker events, a row with too few pairs says so, a row is
green only when every target passed, and a p99 is the nearest-rank p99 (of 100 samples
not the maximum). Pure functions and a small local HTTP server; no vLLM."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec

import numpy as np
import pytest

from lmcache_ec.bench.measure import percentile, summary
from lmcache_ec.bench.serve import Fleet, ServeSettings
from lmcache_ec.bench.serve_report import outcome, summary_line, verdict_text
from lmcache_ec.bench.serve_rows import Block, Sample, add_targets, summarize
from lmcache_ec.bench.serve_timeline import intervals, parse_lines, request_events
from lmcache_ec.bench.vllm_server import ServerError, VLLMServer

FLOOR = "hit TTFT ≤ 1.1x text floor"
VERSUS = "hit TTFT ≤ ECExampleConnector's"


def _rows(mode, ours, theirs, floors=None, in_flight=3, index=0, pattern="reuse 100 %"):
    """An lmcache-ec row and the example's, every request a repeat of its own image,
    built the way ``Fleet.run_block`` builds them (``round`` as it numbers rounds)."""
    rows = []
    for subject, ttfts in (("example", theirs), ("lmcache-disk", ours)):
        block = Block(subject, pattern, mode, index)
        for i, ttft in enumerate(ttfts):
            floor = None if floors is None else floors[i]
            number = i if mode == "lone" else i // in_flight
            block.samples.append(Sample(i, True, ttft, floor=floor, round=number))
        block.counters = {"loads": len(ttfts), "saves": 0}
        rows.append(summarize(block, 0.04, None))
    return rows


def _targets(rows):
    add_targets(rows)
    return {t["text"]: t for t in rows[1]["targets"]}


def test_a_concurrent_round_counts_once_and_four_rounds_give_no_verdict():
    # 12 requests, 3 in flight: 4 rounds whose 3 ratios move together (0.5x each).
    ours = [0.020 * (1 + 0.001 * i) for i in range(12)]
    targets = _targets(_rows("concurrent", ours, [0.040] * 12, floors=[0.04] * 12))
    for found in targets.values():
        assert (found["n"], found["unit"], found["pairs"]) == (4, "rounds", 12)
        assert found["value"] is None and found["verdict"] == "inconclusive"
    # Lone, the same 12 samples are 12 independent pairs: a verdict.
    lone = _targets(_rows("lone", ours, [0.040] * 12, floors=[0.04] * 12))
    assert lone[VERSUS]["n"] == 12 and lone[VERSUS]["verdict"] == "pass"


def test_a_concurrent_interval_is_over_the_rounds_medians():
    # 6 rounds of 3: round r's pair ratios are m_r * (0.9, 1.0, 1.1); median m_r.
    medians = [0.7, 0.75, 0.8, 0.85, 0.9, 0.95]
    ours = [0.040 * m * f for m in medians for f in (0.9, 1.0, 1.1)]
    found = _targets(_rows("concurrent", ours, [0.040] * 18))[VERSUS]
    assert (found["n"], found["pairs"]) == (6, 18)
    # 6 units: k = 1, the interval is the smallest and largest of the round medians.
    assert (found["low"], found["high"]) == pytest.approx((0.7, 0.95), abs=1e-3)
    assert found["value"] == pytest.approx(math.sqrt(0.8 * 0.85), abs=1e-3)
    assert found["verdict"] == "pass"


def test_concurrent_verdicts_at_the_target_are_wrong_at_most_the_intervals_five_percent():
    """Seeded: the round's moment (shared by its 3 requests) dominates, the true median
    ratio is the target (1.0), so any PASS or FAIL is wrong; counted per pair it was
    wrong about a third of the time."""
    rng = np.random.default_rng(2024)
    runs, wrong = 1000, 0
    for _ in range(runs):
        ours = np.repeat(np.exp(rng.normal(0, 0.3, 6)), 3) * np.exp(rng.normal(0, 0.03, 18))
        theirs = np.repeat(np.exp(rng.normal(0, 0.3, 6)), 3) * np.exp(rng.normal(0, 0.03, 18))
        found = _targets(_rows("concurrent", list(0.05 * ours), list(0.05 * theirs)))[VERSUS]
        wrong += found["verdict"] != "inconclusive"
    assert wrong / runs <= 0.05


def test_the_same_ratio_twice_pairs_each_block_with_its_own_example_run():
    # Two "reuse 100 %" blocks: in each, ours equals the example's (true ratio 1.0);
    # the second ran on a machine twice as slow for everyone.
    rng = np.random.default_rng(1)
    first = [0.015 * rng.uniform(0.9, 1.1) for _ in range(12)]
    second = [0.030 * rng.uniform(0.9, 1.1) for _ in range(12)]
    rows = _rows("lone", first, first, index=0) + _rows("lone", second, second, index=1)
    add_targets(rows)
    for row in (rows[1], rows[3]):
        versus = next(t for t in row["targets"] if t["text"] == VERSUS)
        assert versus["value"] == pytest.approx(1.0)  # not 0.5x: the other block's run


def test_a_hit_timeline_takes_no_worker_event_of_a_later_request():
    """R1 missed (only its lookup), R2 hit the same image 3 s later (read, loaded):
    R2's worker events are after R1's first token, so they are not R1's."""
    image, t1, t2 = "x" * 64, 1000.0, 1003.0
    lines = [
        json.dumps(
            {
                "request": "chatcmpl-r1-aaaaaaaa",
                "arrival": t1 + 0.003,
                "seen": t1 + 0.006,
                "items": {image: {"lookup": t1 + 0.0062}},
            }
        ),
        json.dumps({"item": image, "rank": 0, "read": t2 + 0.0075}),
        json.dumps({"item": image, "rank": 0, "loaded": t2 + 0.012}),
        json.dumps(
            {
                "request": "chatcmpl-r2-bbbbbbbb",
                "arrival": t2 + 0.003,
                "seen": t2 + 0.006,
                "items": {image: {"lookup": t2 + 0.0062, "scheduled": t2 + 0.0085}},
            }
        ),
    ]
    timeline = parse_lines(lines)
    first = request_events(timeline, "chatcmpl-r1", t1, t1 + 0.6)
    assert "read" not in first and "loaded" not in first
    assert all(seconds >= 0 for seconds in intervals(first).values())
    second = request_events(timeline, "chatcmpl-r2", t2, t2 + 0.02)
    assert (second["read"], second["loaded"]) == (t2 + 0.0075, t2 + 0.012)
    assert all(seconds >= 0 for seconds in intervals(second).values())


def test_a_row_with_three_pairs_says_so_and_the_summary_counts_it_apart():
    few = _rows("lone", [0.02] * 3, [0.04] * 3, floors=[0.04] * 3, pattern="reuse 50 %")
    enough = _rows("lone", [0.039, 0.041] * 3, [0.04] * 6, floors=[0.04] * 6)
    targets = add_targets(few + enough)
    assert verdict_text(few[1]) == (
        f"INCONCLUSIVE (n=3 pairs; 6 needed for a 95 % interval): {FLOOR}; "
        f"INCONCLUSIVE (n=3 pairs; 6 needed for a 95 % interval): {VERSUS}"
    )
    line = summary_line({"targets": targets, "elapsed_s": 1.0, "machine": {"cpus": 2}})
    assert "1 pass, 0 fail, 1 inconclusive (95 % interval of the paired ratio contains" in line
    assert "2 too few pairs" in line
    rounds = _rows("concurrent", [0.02] * 9, [0.04] * 9, floors=[0.04] * 9)
    add_targets(rounds)
    assert "(n=3 rounds (9 pairs); 6 needed for a 95 % interval)" in verdict_text(rounds[1])


def test_a_row_is_green_only_when_every_target_passed():
    passed = {"pass": True}
    assert outcome({"targets": [passed, passed]}) == "green"
    assert outcome({"targets": [passed, {"pass": None}]}) is None
    assert outcome({"targets": [passed, {"pass": False}]}) == "red"
    assert outcome({"targets": []}) is None


def test_p99_is_the_nearest_rank_not_the_maximum():
    one_stall = [0.001] * 99 + [0.5]  # 100 calls, one of them a 500 ms stall
    assert summary("x", one_stall, 1)["p99_ms"] == pytest.approx(1.0)
    assert summary("x", [0.001] * 98 + [0.5] * 2, 1)["p99_ms"] == pytest.approx(500.0)
    rng = np.random.default_rng(0)
    for n in (1, 7, 99, 100, 101, 480, 1000):
        values = list(rng.random(n))
        for q in (0.5, 0.9, 0.99):
            assert percentile(values, q) == np.percentile(values, q * 100, method="inverted_cdf")


def test_the_channel_benchmarks_p99_is_the_shared_nearest_rank():
    from lmcache_ec.bench.channel_load import _summary

    steps = [(0.001, True)] * 99 + [(0.5, True)]
    found = _summary(steps)
    assert found["busy_p99_ms"] == pytest.approx(1.0) and found["busy_max_ms"] == 500.0


class _Engine(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint: a streamed answer of one token (with its
    logprob) and a /metrics page counting finished requests; or a 500 for each chat."""

    fail = False
    finished = 0
    lock = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        page = f"vllm:request_success_total {type(self).finished}\n"
        self._send(200, page.encode(), "text/plain")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.fail:
            body = b'{"error": {"message": "engine dead", "type": "Internal", "code": 500}}'
            self._send(500, body, "application/json")
            return
        entry = {"token": "a", "logprob": -0.1, "bytes": None, "top_logprobs": []}
        choice = {"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [entry]}}
        chunk = {"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 0}
        chunk |= {"model": "m", "choices": [{**choice, "finish_reason": "length"}]}
        body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
        with type(self).lock:
            type(self).finished += 1
        self._send(200, body, "text/event-stream")


@pytest.fixture
def engine(tmp_path) -> Iterator:
    """``engine(fail)``: a VLLMServer (never launched) whose port answers as ``_Engine``."""
    servers: list[ThreadingHTTPServer] = []

    def start(fail: bool) -> VLLMServer:
        handler = type("Engine", (_Engine,), {"fail": fail, "finished": 0})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        serving = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
        serving.start()
        servers.append(server)
        log = tmp_path / f"server-{len(servers)}.log"
        log.write_text("INFO starting\nERROR EngineCore died: out of memory\n")
        return VLLMServer("m", log, port=server.server_port)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _fleet(tmp_path, servers: dict[str, VLLMServer]) -> Fleet:
    settings = ServeSettings(in_flight=3, timeline=False, settle_s=0.0)
    fleet = Fleet(settings, tmp_path, tmp_path, floor="a text prompt")
    fleet.servers = servers
    return fleet


def test_run_block_numbers_its_rounds_and_its_blocks(tmp_path, engine):
    fleet = _fleet(tmp_path, {"lmcache-disk": engine(False)})
    names = {"lmcache-disk": "lmcache-disk"}
    first = fleet.run_block(names, "reuse 100 %", "concurrent", [1, 2, 3, 4], [True] * 4)
    second = fleet.run_block(names, "reuse 100 %", "concurrent", [1, 2, 3, 4], [True] * 4)
    assert [b.index for b in first + second] == [0, 1]
    assert [s.round for s in first[0].samples] == [0, 0, 0, 1]
    rows = [summarize(b, 0.04, None) for b in first + second]
    assert [r["block"] for r in rows] == [0, 1]
    assert [s["round"] for s in rows[0]["samples"]] == [0, 0, 0, 1]


def test_a_failed_request_is_a_server_error_with_the_servers_log(tmp_path, engine):
    fleet = _fleet(tmp_path, {"example": engine(True)})
    with pytest.raises(ServerError) as raised:
        fleet.run_block({"example": "example"}, "reuse 0 %", "lone", [1], [False])
    said = str(raised.value)
    assert "InternalServerError" in said and "EngineCore died: out of memory" in said
    dead = VLLMServer("m", tmp_path / "none.log", port=_closed_port())
    with pytest.raises(ServerError, match="APIConnectionError"):
        _fleet(tmp_path, {"a": dead}).ask(dead, 1)


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:  # bound, then closed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(find_spec("vllm") is None, reason="bench serve refuses to start without vllm")
def test_bench_serve_reports_a_failed_request_in_one_error_not_a_traceback(
    tmp_path, engine, invoke, monkeypatch
):
    import lmcache_ec.bench.serve as serve

    server = engine(True)

    def measure_one_request(settings, progress, command=""):
        fleet = _fleet(tmp_path, {"example": server})
        return fleet.run_block({"example": "example"}, "reuse 0 %", "lone", [1], [False])

    monkeypatch.setattr(serve, "run_serve", measure_one_request)
    args = ["bench", "serve", "--subjects", "example", "--lone", "1", "--concurrent", "0"]
    result = invoke(*args, "--no-timeline", expect=1)
    assert isinstance(result.exception, SystemExit)  # typer.Exit, not openai's error
    assert "error: a chat request to http://127.0.0.1" in result.output
    assert "Traceback" not in result.output
