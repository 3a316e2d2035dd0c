"""``bench channel``: connector time per step with the stage channel under load (small run)."""

from __future__ import annotations

import json

SUMMARY = ("steps", "busy_steps", "busy_median_ms", "busy_p99_ms", "busy_max_ms", "idle_max_ms")


def test_bench_channel_json(invoke, tmp_path):
    out = tmp_path / "channel.json"
    args = ["bench", "channel", "--items", "124", "--busy", "1", "--pause-s", "0.2"]
    result = invoke(*args, "--forward-ms", "1", "--json", out)
    assert "Stage channel, 124 items a step" in result.stdout
    data = json.loads(out.read_text())
    assert set(data) == {"settings", "phases", "all", "target_ms", "p99_within_target"}
    assert data["target_ms"] == 11.0  # busy_stage_wait_s (10 ms) + 1 ms
    save, load = data["phases"]["save"], data["phases"]["load"]
    assert save["encoded"] == 124 and save["counters"]["saves_submitted"] == 124
    assert load["largest_order_step"] == 124  # every image ordered in one step
    assert load["requests_finished"] == load["requests"] == 2
    assert load["encoded"] == 0 and load["loaded"] == load["loaded_bit_exact"] == 124
    for phase in (save, load, data["all"]):
        for name in SUMMARY:
            assert isinstance(phase[name], (int, float)) and phase[name] >= 0, name
        assert phase["busy_steps"] >= 1
        largest = phase["busy_largest_ms"]
        assert largest == sorted(largest, reverse=True) and largest[0] == phase["busy_max_ms"]
        assert len(largest) == min(8, phase["busy_steps"])
    assert save["hostile_connections"] >= 1 and load["hostile_connections"] >= 1
    assert data["p99_within_target"] == (data["all"]["busy_p99_ms"] <= 11.0)


def test_bench_channel_rejects_bad_numbers(invoke):
    result = invoke("bench", "channel", "--items", "0", expect=2)
    assert "--items and --busy must be >= 1" in result.output
