"""`lmcache-ec bench`: one run over every tier, on a tiny configuration.

Real processes and servers throughout (redis-server, moto's S3 server, vLLM's
example connector). The tests check the result's shape and that every
measured read really returned the stored tensor — never timings.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.servers import free_port

TIERS = ("cpu", "disk", "redis", "s3")
OPS = {
    "cpu": {"put (cold pool)", "put", "get", "get_many", "start-up (0.05 GB CPU tier)"},
    "disk": {"put", "put (until stored)", "get", "get_many", "get (restarted)"},
    "redis": {"put", "put (until stored)", "get", "get_many"},
    "s3": {"put", "put (until stored)", "get", "get_many"},
    "scheduler": {
        "has_cache_item, ready",
        "has_cache_item, unknown",
        "tier lookup, first sight",
        "tier lookup, answered",
    },
    "connector": {"save_caches"},
}
MEASUREMENT_KEYS = {"label", "n", "median_ms", "p99_ms", "mb_s", "hits", "note"}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_measurement(measured: dict, row: dict) -> None:
    assert set(measured) >= MEASUREMENT_KEYS, (row["tier"], row["op"], measured)
    assert isinstance(measured["label"], str) and measured["label"]
    assert isinstance(measured["n"], int) and measured["n"] >= 1
    assert _number(measured["median_ms"]) and measured["median_ms"] > 0
    assert _number(measured["p99_ms"]) and measured["p99_ms"] >= measured["median_ms"]
    assert measured["mb_s"] is None or (_number(measured["mb_s"]) and measured["mb_s"] > 0)
    assert measured["hits"] is None or 0 <= measured["hits"] <= measured["n"]


def _check_baseline(base, row: dict) -> None:
    if base is None:
        return
    if "na" in base:
        assert set(base) == {"label", "na"} and base["na"], base
        return
    _check_measurement(base, row)


@pytest.mark.slow
def test_bench_quick_tiny_run_writes_the_documented_json(
    tmp_path, invoke, redis_url, s3_server, s3_bucket
):
    path = tmp_path / "bench.json"
    out = invoke(
        "bench",
        "--quick",
        "--shapes",
        "8x16",
        "--iterations",
        "4",
        "--batch",
        "2",
        "--startup-cpu-gb",
        "0.05",
        "--lookup-items",
        "200",
        "--redis-url",
        redis_url,
        "--s3-endpoint",
        s3_server.endpoint,
        "--s3-url",
        f"s3://{s3_bucket}/bench",
        "--directory",
        str(tmp_path),
        "--markdown",
        str(tmp_path / "bench.md"),
        "--json",
        str(path),
    ).stdout
    result = json.loads(path.read_text())

    assert result["schema"] == "lmcache-ec-bench/1"
    for key in ("created", "command", "machine", "settings", "convention", "elapsed_s"):
        assert key in result
    assert result["settings"]["quick"] is True
    assert result["settings"]["shapes"] == [[8, 16]] and result["settings"]["iterations"] == 4
    assert result["machine"]["cpus"] >= 1
    assert set(result["tiers"]) == set(TIERS)
    for tier in TIERS:
        assert result["tiers"][tier]["status"] == "measured", result["tiers"][tier]
    assert result["skipped"] == []

    rows = result["rows"]
    found: dict[str, set[str]] = {}
    for row in rows:
        found.setdefault(row["tier"], set()).add(row["op"])
        _check_measurement(row["ours"], row)
        for name in (
            "upstream",
            "example",
            "limit",
            "cpu_only",
            "verified",
            "cpu_read",
            "ours_read_once",
            "example_read_once",
            "verified_read_once",
        ):
            _check_baseline(row.get(name), row)
        assert isinstance(row["ratios"], dict)
        assert all(v is None or (_number(v) and v > 0) for v in row["ratios"].values())
        for target in row["targets"]:
            assert target["pass"] in (True, False, None) and isinstance(target["text"], str)
        if row["ours"]["hits"] is not None:  # every read of lmcache-ec returned the tensor
            assert row["ours"]["hits"] == row["ours"]["n"], row
    assert found == OPS

    by_key = {(r["tier"], r["op"]): r for r in rows}
    # Baselines are there where they apply, and say why where they cannot run.
    assert by_key[("cpu", "get")]["upstream"]["hits"] == 4
    assert by_key[("cpu", "get")]["limit"]["label"] == "tensor.clone()"
    disk_get = by_key[("disk", "get")]
    assert disk_get["example"]["hits"] == 4 and disk_get["limit"]["median_ms"] > 0
    # Beside the bare read, the floor of a read that verifies: its ratio is ours to it.
    assert disk_get["verified"]["label"] == "readinto + xxh3"
    assert (
        disk_get["ratios"]["verified"]
        == disk_get["verified"]["median_ms"] / disk_get["ours"]["median_ms"]
    )
    # References beside the targets: each a ratio of two cells of the same row.
    cpu_get = by_key[("cpu", "get")]
    assert cpu_get["cpu_read"]["hits"] == 4  # LMCache's CPU backend alone, checked too
    assert cpu_get["ratios"]["backend_bound"] == (
        cpu_get["limit"]["median_ms"] / cpu_get["cpu_read"]["median_ms"]
    )
    for op in ("get", "get_many"):
        row = by_key[("cpu", op)]
        assert row["ratios"]["copy_bound"] == (
            row["upstream"]["median_ms"] / row["limit"]["median_ms"]
        )
    assert disk_get["ours_read_once"]["hits"] == disk_get["example_read_once"]["hits"] == 4
    assert disk_get["ratios"]["read_once"] == (
        disk_get["example_read_once"]["median_ms"] / disk_get["ours_read_once"]["median_ms"]
    )
    assert disk_get["ratios"]["example_read_once_bound"] == (
        disk_get["example_read_once"]["median_ms"] / disk_get["verified_read_once"]["median_ms"]
    )
    shown = {
        (t["tier"], t["op"], name)
        for t in result["targets"]
        for name, value in t["references"].items()
        if value is not None
    }
    assert shown == {
        ("cpu", "get", "backend_bound"),
        ("cpu", "get", "copy_bound"),
        ("cpu", "get_many", "copy_bound"),
        ("disk", "get", "verify_bound"),
        ("disk", "get", "example_verify_bound"),
        ("disk", "get", "read_once"),
        ("disk", "get", "example_read_once_bound"),
        ("disk", "get_many", "verified_loop"),
        ("redis", "get_many", "item_loop"),
    }
    assert all(_number(v) for t in result["targets"] for v in t["references"].values() if v)
    s3_many = [t for t in result["targets"] if (t["tier"], t["op"]) == ("s3", "get_many")]
    assert s3_many[0]["references"] == {"item_loop": None}  # upstream cannot reach S3
    assert "read once each:" in out and "bound" in out
    assert "0/4 hits" in disk_get["upstream"]["note"]  # its get() reads the CPU tier only
    assert by_key[("disk", "get (restarted)")]["upstream"]["hits"] == 0
    assert by_key[("disk", "get (restarted)")]["ratios"]["upstream"] is None
    assert by_key[("disk", "get_many")]["batch"] == 2
    assert by_key[("redis", "get")]["upstream"]["hits"] == 4
    assert by_key[("redis", "get")]["limit"]["label"] == "redis-py GET"
    assert "na" in by_key[("s3", "get")]["upstream"]
    assert by_key[("s3", "get")]["limit"]["label"] == "boto3 get_object"
    for tier in ("disk", "redis", "s3"):
        put = by_key[(tier, "put")]
        assert 0 <= put["ours"]["in_flight"] <= put["ours"]["n"]
        assert put["cpu_only"]["median_ms"] > 0
    save = by_key[("connector", "save_caches")]
    assert save["ours"]["stored"] == save["ours"]["n"]  # every hand-off reached the tiers
    lookup = by_key[("scheduler", "tier lookup, first sight")]
    assert "remote tier: Redis" in lookup["ours"]["note"]  # measured with a remote tier
    startup = by_key[("cpu", "start-up (0.05 GB CPU tier)")]
    assert startup["upstream"]["rss_mb"] >= 0 and startup["ours"]["rss_mb"] >= 0

    # Targets: each evaluated on a row of this run.
    texts = {t["text"] for t in result["targets"]}
    assert any("clone()" in t for t in texts) and any("redis-py" in t for t in texts)
    assert {(t["tier"], t["op"]) for t in result["targets"]} <= set(by_key)

    # The table, the chart (next to the JSON) and the Markdown copy.
    assert "targets:" in out and "ECCacheEngine" in out
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "bench.md").read_text()
    assert table.startswith("| tier | shape | op |") and "| redis |" in table


def test_bench_reports_unreachable_stores_as_skipped(tmp_path, invoke):
    path = tmp_path / "bench.json"
    out = invoke(
        "bench",
        "--tiers",
        "redis,s3",
        "--redis-url",
        f"redis://:hunter2@127.0.0.1:{free_port()}",
        "--s3-endpoint",
        f"http://127.0.0.1:{free_port()}",
        "--no-connector",
        "--no-startup",
        "--no-chart",
        "--json",
        str(path),
    ).stdout
    result = json.loads(path.read_text())
    assert result["rows"] == []
    for tier in ("redis", "s3"):
        assert result["tiers"][tier]["status"] == "skipped"
        assert "unreachable" in result["tiers"][tier]["reason"]
    assert {s["tier"] for s in result["skipped"]} == {"redis", "s3"}
    assert out.count("skipped:") == 2
    # The password given in the URL appears nowhere in what the run writes.
    assert "hunter2" not in path.read_text() and "hunter2" not in out


def _engine(median: float, p99: float, n: int = 4, hits: int | None = 4) -> dict:
    return {
        "label": "x",
        "n": n,
        "median_ms": median,
        "p99_ms": p99,
        "mb_s": 1 / median,
        "hits": hits,
        "note": "",
    }


def test_repeated_runs_report_the_median_of_their_medians():
    from lmcache_ec.bench.measure import merge_repeats, not_available
    from lmcache_ec.bench.targets import ratios

    runs = [
        [
            {
                "tier": "disk",
                "op": "get",
                "shape": [8, 16],
                "ours": {**_engine(ours, 2 * ours), "in_flight": 2},
                "upstream": _engine(upstream, 2 * upstream, hits=None),
                "example": not_available("e", "why"),
            }
        ]
        for ours, upstream in ((0.2, 0.6), (0.7, 0.7), (0.3, 1.2))
    ]
    (row,) = merge_repeats(runs, ratios)
    assert row["ours"]["median_ms"] == 0.3 and row["ours"]["p99_ms"] == 0.6
    assert row["ours"]["runs_ms"] == [0.2, 0.7, 0.3]
    assert row["ours"]["mb_s"] == pytest.approx(1 / 0.3)
    assert row["ours"]["n"] == 12 and row["ours"]["hits"] == 12
    assert row["ours"]["in_flight"] == 6  # counts out of n are summed like n
    assert row["upstream"]["median_ms"] == 0.7 and row["upstream"]["hits"] is None
    assert row["example"] == not_available("e", "why")
    # Each run's baseline against that run's own time (3.0, 1.0, 4.0), not 0.7 / 0.3.
    assert row["ratios"]["upstream"] == pytest.approx(3.0)
    assert merge_repeats(runs[:1], ratios) == runs[0]
    with pytest.raises(ValueError, match="different rows"):
        merge_repeats([runs[0], [{**runs[1][0], "op": "put"}]], ratios)


def test_references_are_ratios_of_the_rows_own_cells_and_never_change_a_verdict():
    from lmcache_ec.bench.measure import merge_repeats
    from lmcache_ec.bench.report import table_rows
    from lmcache_ec.bench.targets import annotate, ratios

    def run(ours: float, upstream: float, copy: float, cpu_read_hits: int = 4) -> list[dict]:
        return [
            {
                "tier": "cpu",
                "op": "get",
                "shape": [8, 16],
                "ours": _engine(ours, ours),
                "upstream": _engine(upstream, upstream),
                "limit": _engine(copy, copy),
                "cpu_read": _engine(0.25, 0.25, hits=cpu_read_hits),
            }
        ]

    # Per run: upstream / one copy = 2.0, 1.0, 3.0; the row takes their median.
    (row,) = merge_repeats([run(1.0, 0.4, 0.2), run(1.0, 0.3, 0.3), run(1.0, 0.6, 0.2)], ratios)
    assert row["ratios"]["copy_bound"] == pytest.approx(2.0)
    assert row["ratios"]["backend_bound"] == pytest.approx(0.2 / 0.25)
    results = annotate([row])
    by_text = {t["text"]: t for t in results}
    upstream = by_text["get ≥ 1.5x upstream"]
    assert upstream["pass"] is False  # 0.4 / 1.0: the bound is shown, the verdict stands
    assert upstream["references"] == {"copy_bound": pytest.approx(2.0)}
    cells, _ = table_rows({"rows": [row], "skipped": []})
    assert "FAIL 0.40≥1.5 vs upstream (bound 2.00x: one copy)" in cells[0][-1]

    # A cell that missed gives no reference, and none is shown.
    (missed,) = run(1.0, 0.4, 0.2, cpu_read_hits=1)
    missed["ratios"] = ratios(missed)
    assert missed["ratios"]["backend_bound"] is None
    annotate([missed])
    cells, _ = table_rows({"rows": [missed], "skipped": []})
    assert "LMCache's CPU read" not in cells[0][-1]


def test_bench_repeat_runs_each_job_in_fresh_processes(tmp_path, invoke):
    path = tmp_path / "bench.json"
    invoke(
        "bench",
        "--quick",
        "--tiers",
        "cpu",
        "--shapes",
        "8x16",
        "--iterations",
        "4",
        "--batch",
        "2",
        "--no-startup",
        "--no-connector",
        "--repeat",
        "2",
        "--directory",
        str(tmp_path),
        "--no-chart",
        "--json",
        str(path),
    )
    result = json.loads(path.read_text())
    assert result["settings"]["repeat"] == 2
    rows = result["rows"]
    assert {row["op"] for row in rows} == {"put (cold pool)", "put", "get", "get_many"}
    for row in rows:
        _check_measurement(row["ours"], row)
        assert len(row["ours"]["runs_ms"]) == 2 and all(_number(v) for v in row["ours"]["runs_ms"])
        if row["ours"]["hits"] is not None:  # every read of both runs returned the tensor
            assert row["ours"]["hits"] == row["ours"]["n"] == 2 * 4, row


def test_bench_rejects_unknown_tier(invoke):
    assert "unknown tier" in invoke("bench", "--tiers", "cpu,tape", expect=2).output


def test_local_s3_server_without_moto_names_the_extra():
    """moto is not a runtime dependency: without it, the error names the extra to install."""
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['moto'] = None\n"
        "from lmcache_ec.bench.servers import MissingDependency, moto_process\n"
        "try:\n"
        "    with moto_process():\n"
        "        pass\n"
        "except MissingDependency as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('started without moto')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert "pip install 'lmcache-ec[bench]'" in done.stdout
    assert "moto.server is not installed" in done.stdout


@pytest.mark.slow
def test_bench_fleet_tiny_run_is_consistent(tmp_path, invoke, redis_url):
    """Two engine processes on one real Redis: every request is either an encode or
    a hit, every image is encoded somewhere, the bytes and copies add up."""
    path = tmp_path / "fleet.json"
    out = invoke(
        "bench",
        "fleet",
        "--nodes",
        "2",
        "--requests",
        "12",
        "--images",
        "4",
        "--shape",
        "8x16",
        "--encode-ms",
        "5",
        "--redis-url",
        redis_url,
        "--json",
        str(path),
    ).stdout
    result = json.loads(path.read_text())
    assert "bytes moved per tier" in out

    runs = {run["label"]: run for run in result["runs"]}
    expected = {"one process", "2 processes, claims off"}
    if result["claims_supported"]:
        expected.add("2 processes, claims on")
    assert set(runs) == expected
    for label, run in runs.items():
        unique = run["unique_images"]
        assert 1 <= unique <= 4 and run["requests"] == run["finished"] == 12, label
        assert run["hits"] + run["encodes"] == run["requests"], label
        assert run["encodes"] >= unique, label  # nothing was stored before the run
        assert sum(run["tier_hits"].values()) <= run["hits"], label
        assert run["frame_bytes"] >= 8 * 16 * 2
        moved = run["bytes"]
        assert moved["cpu"]["put"] >= run["encodes"] * run["frame_bytes"] * 0.99, label
        # Every image reached the shared store once at least.
        assert moved["remote"]["put"] >= unique * run["frame_bytes"] * 0.99, label
        assert moved["remote"]["get"] == round(
            run["tier_hits"].get("remote", 0) * run["frame_bytes"]
        )
        memory = run["memory"]
        assert memory["per_process_bytes"] >= memory["one_copy_bytes"] > 0, label
        assert len(run["per_node"]) == run["nodes"]
        assert sum(n["requests"] for n in run["per_node"]) == 12
    single = runs["one process"]
    assert single["nodes"] == 1 and single["hit_rate_vs_one_process"] == 1.0
    assert single["memory"]["per_process_bytes"] == single["memory"]["one_copy_bytes"]
    fleet = runs["2 processes, claims off"]
    assert [n["requests"] for n in fleet["per_node"]] == [6, 6]  # round-robin

    import redis

    with redis.Redis.from_url(redis_url) as client:
        assert client.dbsize() == 0  # every run's entries and its start barrier removed


@pytest.mark.slow
def test_bench_fleet_node_tier_holds_one_host_copy_per_image(tmp_path, invoke, redis_url):
    """With --node-tier the processes keep no CPU-tier copies: each image the
    stream saw is held once, in the shared node tier, whatever the process count."""
    path = tmp_path / "fleet.json"
    invoke(
        "bench", "fleet", "--nodes", "2", "--requests", "12", "--images", "4",
        "--shape", "8x16", "--encode-ms", "5", "--node-tier", "--no-baseline",
        "--redis-url", redis_url, "--json", str(path),
    )  # fmt: skip
    result = json.loads(path.read_text())
    assert result["settings"]["node_tier"] is True
    for run in result["runs"]:
        memory = run["memory"]
        unique = run["unique_images"]
        assert memory["per_process_bytes"] == 0, run["label"]
        assert memory["node_tier_images"] == unique, run["label"]
        assert unique * 8 * 16 * 2 < memory["node_tier_bytes"] <= unique * run["frame_bytes"]


def test_bench_fleet_api_tiny_run_is_consistent(tmp_path, invoke, redis_url):
    """Two library processes on one shared disk directory, both ways: every request
    is an encode or a hit, every image is encoded somewhere, waits are counted."""
    path = tmp_path / "fleet-api.json"
    args = ["--nodes", "2", "--requests", "12", "--images", "4", "--shape", "8x16"]
    out = invoke(
        "bench", "fleet", "--api", "--store", "disk", *args, "--encode-ms", "5",
        "--no-baseline", "--redis-url", redis_url, "--json", str(path),
    )  # fmt: skip
    assert "through the library API" in out.output
    result = json.loads(path.read_text())
    assert [run["label"] for run in result["runs"]] == [
        "2 processes, get/put",
        "2 processes, get_or_compute",
    ]
    for run in result["runs"]:
        assert run["requests"] == 12 and run["hits"] + run["encodes"] == 12
        assert run["unique_images"] <= run["encodes"] <= 12
        assert (run["waits"] == 0) == (run["waiter_ms"]["p50"] is None)


def test_bench_fleet_rejects_unknown_store(invoke):
    assert "unknown store" in invoke("bench", "fleet", "--store", "tape", expect=2).output
    # One disk directory is a shared tier for the library processes only.
    assert "unknown store" in invoke("bench", "fleet", "--store", "disk", expect=2).output


def test_benchmarks_reach_private_state_only_through_seams():
    """Private attributes and names (ours or upstream's) are read in bench/private_access.py only.

    bench/steps.py is left out: its in-step mode rewires the scheduler until the
    connector offers that mode as a setting.
    """
    import ast
    from pathlib import Path

    import lmcache_ec

    package = Path(lmcache_ec.__file__).parent
    files = [*package.glob("bench/*.py"), *package.glob("cli/bench*.py")]
    found = []
    for path in files:
        if path.name in ("private_access.py", "steps.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Attribute):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls", "os"):
                    continue  # own state; os._exit
                names = [node.attr]
            elif isinstance(node, ast.ImportFrom):
                names = [alias.name for alias in node.names]
            found += [
                f"{path.name}:{node.lineno}: {name}"
                for name in names
                if name.startswith("_") and not name.endswith("__")
            ]
    assert len(files) > 10 and found == []


def test_bench_node_reads_reads_every_shape_both_ways(tmp_path, invoke):
    path = tmp_path / "node-reads.json"
    out = invoke("bench", "node-reads", "--iterations", "2", "--json", str(path)).output
    assert "Node-tier read + verify" in out
    rows = json.loads(path.read_text())
    assert [row["model"] for row in rows] == ["Gemma-3", "Gemma-3-27B", "Qwen2.5-VL"]
    for row in rows:
        for method in ("mapped", "copied", "get"):
            assert row[method]["hits"] == row[method]["n"] == 2, (row["model"], method)
        assert row["copied_vs_mapped"] > 0


def test_bench_fingerprint_times_every_method(tmp_path, invoke):
    path = tmp_path / "fingerprint.json"
    invoke(
        "bench", "fingerprint", "--tensors", "2", "--elements", "5000", "--repeat", "2",
        "--json", str(path),
    )  # fmt: skip
    result = json.loads(path.read_text())
    assert result["bytes"] == 2 * 5000 * 2
    for method in ("sums", "mixed", "host_hash", "hash"):
        assert result[method]["n"] == 2 and result[method]["median_ms"] > 0
    assert result["gpu_estimate"]["mixed_ms_per_gb"] < result["gpu_estimate"]["sums_ms_per_gb"]
