"""``bench steps``: the same workload with prefetch and with reads inside the step."""

from __future__ import annotations

import json

NUMBERS = (
    "steps",
    "step_median_ms",
    "step_p99_ms",
    "step_max_ms",
    "overhead_median_ms",
    "overhead_p99_ms",
    "overhead_max_ms",
    "overhead_total_ms",
    "remote_request_median_ms",
    "local_request_median_ms",
)


def test_bench_steps_json(invoke, redis_url, tmp_path):
    out = tmp_path / "steps.json"
    args = ["bench", "steps", "--redis-url", redis_url, "--delay-ms", "10", "--arrivals", "6"]
    result = invoke(*args, "--busy", "1", "--encode-ms", "1", "--forward-ms", "1", "--json", out)
    assert "prefetch (lmcache-ec)" in result.stdout
    data = json.loads(out.read_text())
    assert set(data) == {"settings", "modes", "ratios"}
    assert data["settings"]["delay_ms"] == 10
    for mode in ("prefetch", "in-step"):
        row = data["modes"][mode]
        for name in NUMBERS:
            assert isinstance(row[name], (int, float)) and row[name] >= 0, (mode, name)
        assert row["remote_hits"] >= 1  # remote hits were loaded, not encoded ...
        assert row["remote_images_encoded"] == 0
    # ... by a worker thread ahead of the step, or inside the step.
    assert data["modes"]["prefetch"]["loads_read_inside_step"] == 0
    assert (
        data["modes"]["in-step"]["loads_read_inside_step"]
        == data["modes"]["in-step"]["remote_hits"]
    )
    assert all(value > 0 for value in data["ratios"].values())


def test_bench_steps_rejects_bad_numbers(invoke):
    result = invoke("bench", "steps", "--arrivals", "0", expect=2)
    assert "--arrivals must be >= 1" in result.output
