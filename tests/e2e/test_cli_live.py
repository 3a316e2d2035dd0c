"""``lmcache-ec stats`` and ``ls`` against a live vLLM server and its tiers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, start_http_server

from lmcache_ec.bench.vllm_server import BackgroundDecode, read_metrics

from .conftest import BACKGROUND_TOKENS, CLI_IMAGES, IMAGES, ask

# The first test also pays for the session's server starts (two waves).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def cli(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
    binary = Path(sys.executable).with_name("lmcache-ec")
    command = [str(binary)] if binary.exists() else [sys.executable, "-m", "lmcache_ec.cli"]
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == expect, (done.returncode, done.stdout, done.stderr)
    return done


@pytest.fixture
def disk_config(fleet, tmp_path) -> str:
    path = tmp_path / "lmcache.yaml"
    path.write_text(yaml.safe_dump({"ec": {"local_disk": str(fleet.disk_a)}}))
    return str(path)


def _page_hits(url: str) -> dict[str, float]:
    page = read_metrics(url)
    hits = {labels["tier"]: value for labels, value in page.get("vllm:lmcache_ec_hits_total", [])}
    misses = sum(value for _, value in page.get("vllm:lmcache_ec_misses_total", []))
    return {**hits, "misses": misses}


def test_stats_reads_the_counters_vllm_exports(fleet, disk_config):
    server = fleet.servers["disk"]
    with BackgroundDecode(server.base_url, server.served_model, max_tokens=BACKGROUND_TOKENS):
        for image in CLI_IMAGES:
            ask(server, image)
    deadline = time.monotonic() + 15  # counters reach the page with a later step's stats
    while (page := _page_hits(server.metrics_url)).get("disk", 0) == 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"no disk hits on the page to read back: {page}")
        time.sleep(0.2)

    data = json.loads(
        cli("stats", "--config", disk_config, "--metrics-url", server.metrics_url, "--json").stdout
    )
    counters = data["counters"]
    assert counters["hits[disk]"] == page["disk"]
    assert counters["misses"] == page["misses"]
    hits = sum(v for k, v in page.items() if k != "misses")
    assert counters["hit_rate"] == pytest.approx(hits / (hits + page["misses"]))
    assert counters["hit_rate"] > 0

    text = cli("stats", "--config", disk_config, "--metrics-url", server.metrics_url).stdout
    assert "hits[disk]" in text and "loads" in text


def test_stats_says_when_the_page_has_no_lmcache_ec_metrics(disk_config):
    registry = CollectorRegistry()
    Counter("unrelated_requests", "Something else", registry=registry).inc()
    http, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{http.server_port}/metrics"
        done = cli("stats", "--config", disk_config, "--metrics-url", url, expect=1)
    finally:
        http.shutdown()
    assert "no lmcache-ec metrics" in done.stderr
    assert "hit_rate" not in done.stdout


def test_ls_lists_what_the_server_wrote(fleet, disk_config):
    # The model is served from a /tmp path, so its storage-name slug starts
    # with "tmp-": entry names contain ".tmp-", the disk tier's temp-file marker.
    rows = json.loads(cli("ls", "--config", disk_config, "--json").stdout)
    assert len(rows) == len(IMAGES)
    assert {row["tier"] for row in rows} == {"disk"}
    text = cli("ls", "--config", disk_config).stdout
    assert "disk" in text
