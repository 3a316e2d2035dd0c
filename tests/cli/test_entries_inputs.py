"""stats and ls given an endpoint, a tier or an option they cannot use: exit 1 (2 for
a bad option) with a message, never a hang and never a number that is not so.

- ``stats --metrics-url`` at a server trickling its answer a byte at a time
  gives up at its deadline (``urlopen``'s timeout bounds each read only), and
  at a page past its size limit reads no further;
- ``stats`` whose remote tier cannot be listed leaves the remote out, with
  the warning, as it leaves out a disk tier it cannot list: never "0 entries";
- ``ls --limit`` below 0 is refused as invalid usage.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lmcache_ec.cli import entries
from tests.servers import Drip

from .conftest import config_without, populate, remote_config_file

BOUND_S = 10.0  # far past the deadlines set here; only a hung command reaches it


def _within_bound(run: Callable[[], object]) -> object:
    """``run()``'s result, run aside so that a command that hangs fails the test."""
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(run()), daemon=True)
    worker.start()
    worker.join(BOUND_S)
    assert done, f"still running after {BOUND_S:g}s"
    return done[0]


def _said(result) -> str:
    """A clean exit 1's output, the console's line wrapping undone."""
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    return " ".join(result.output.split())


@pytest.fixture
def trickle() -> Iterator[Drip]:
    drip = Drip("http", interval=0.05)  # a byte every 50 ms: each read is quick
    yield drip
    drip.close()


def test_stats_gives_up_on_a_metrics_endpoint_that_trickles_its_answer(
    config_file, invoke, trickle, monkeypatch
):
    monkeypatch.setattr(entries, "SCRAPE_DEADLINE_S", 1.0)
    url = f"http://127.0.0.1:{trickle.port}/metrics"
    result = _within_bound(
        lambda: invoke("stats", "--config", config_file, "--metrics-url", url, expect=None)
    )
    assert f"cannot read metrics from {url}: no whole answer within 1s" in _said(result)
    assert trickle.dripping.wait(BOUND_S)  # it did answer, a byte at a time


class _Large(BaseHTTPRequestHandler):
    """A valid metrics page of 128 KiB: one counter, then comment lines."""

    body = b"lmcache_ec_misses_total 1\n" + b"# padding\n" * (128 * 1024 // 10)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet test output


def test_stats_reads_no_metrics_page_past_its_size_limit(config_file, invoke, monkeypatch):
    monkeypatch.setattr(entries, "SCRAPE_MAX_BYTES", 64 * 1024)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Large)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        result = invoke("stats", "--config", config_file, "--metrics-url", url, expect=None)
    finally:
        server.shutdown()
        server.server_close()
    assert f"cannot read metrics from {url}: the answer is larger than 64.0 KB" in _said(result)


def test_stats_leaves_out_a_remote_tier_it_could_not_list(
    tmp_path, disk_dir, redis_process, invoke
):
    """A user who may do all but SCAN: the remote holds entries it cannot count."""
    config = remote_config_file(tmp_path, disk_dir, redis_process.url)
    populate(config, "org/model-a", "tenant-1", 3)
    no_scan = config_without(tmp_path, disk_dir, redis_process, "scan")
    result = invoke("stats", "--config", no_scan, "--json", expect=None)
    assert "remote tier skipped" in _said(result)
    shown = json.loads(result.stdout)
    assert "remote" not in shown["tiers"], shown["tiers"]
    assert shown["tiers"]["disk"]["entries"] == 3  # the tiers it could list, as ever


def test_ls_refuses_a_negative_limit(config_file, invoke):
    result = invoke("ls", "--config", config_file, "--limit", "-5", expect=2)
    said = " ".join(result.output.split())
    assert "Invalid value for '--limit'" in said and "greater than or equal to 0" in said
