"""ls / purge / stats given what they cannot use: a clear message and exit 1, no traceback.

- a disk directory that cannot be listed (here a regular file; another
  user's directory is ``tests/chaos/test_unusable_disk_dir.py``): the disk
  tier is skipped with a warning naming it, the other tiers are still served;
- a ``--metrics-url`` page that is not Prometheus text (an HTML page, a body
  that is not UTF-8), served by a real HTTP server on 127.0.0.1, or a server
  there that does not answer in HTTP at all.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .conftest import write_config


def _clean_failure(result) -> str:
    """Exit 1 through the command's own error path, not an uncaught exception;
    the output with the console's line wrapping undone."""
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


@pytest.fixture
def unlistable_disk(tmp_path) -> str:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    return write_config(tmp_path / "c.yaml", local_disk=str(blocker))


@pytest.mark.parametrize(
    "command",
    [("ls",), ("ls", "--json"), ("stats",), ("stats", "--json"), ("purge", "--all")],
    ids=lambda c: "-".join(c),
)
def test_an_unlistable_disk_directory_is_a_warning_and_exit_1(unlistable_disk, invoke, command):
    result = invoke(*command, "--config", unlistable_disk, expect=None)
    said = _clean_failure(result)
    assert "disk tier skipped" in said
    # Wrapped at any character of a long path: compared without whitespace.
    assert "a-file:Notadirectory" in "".join(said.split())


def test_purge_of_an_unlistable_disk_directory_claims_no_deletion(unlistable_disk, invoke):
    result = invoke("purge", "--all", "--config", unlistable_disk, expect=None)
    said = _clean_failure(result)
    assert "disk: deleted" not in said  # nothing was looked at there
    assert "purge marker" not in said  # one message for the directory, not two


class _Page(BaseHTTPRequestHandler):
    body = b""
    content_type = "text/html"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet test output


@pytest.fixture
def serve() -> Iterator:
    """``serve(body, content_type)``: the URL of a page that returns ``body``."""
    servers: list[ThreadingHTTPServer] = []

    def start(body: bytes, content_type: str) -> str:
        handler = type("Page", (_Page,), {"body": body, "content_type": content_type})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/metrics"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"<!doctype html><html><body><h1>Login</h1></body></html>\n", "text/html"),
        (b"\xff\xfe\x00binary\x80\x81 not utf-8\n", "application/octet-stream"),
    ],
    ids=["html", "not-utf8"],
)
def test_stats_reports_a_metrics_page_that_is_not_prometheus_text(
    config_file, invoke, serve, body, content_type
):
    url = serve(body, content_type)
    result = invoke("stats", "--config", config_file, "--metrics-url", url, expect=None)
    said = _clean_failure(result)
    assert f"{url} is not a Prometheus metrics page" in said


def test_stats_reports_a_metrics_server_that_does_not_speak_http(config_file, invoke):
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:  # one connection: a line that is no HTTP status line
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            connection.sendall(b"garbage\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    try:
        result = invoke("stats", "--config", config_file, "--metrics-url", url, expect=None)
    finally:
        listener.close()
    said = _clean_failure(result)
    assert f"cannot read metrics from {url}: not an HTTP response" in said
