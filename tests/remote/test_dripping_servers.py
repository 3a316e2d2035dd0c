"""A server that answers a byte at a time, each byte within any socket timeout,
holds no remote call past ``remote_timeout`` + 0.5 s, and no process for ever.

- an upload (the existence check, the write) is given up as a whole: the tier
  is marked unavailable, the entry remembered for the re-send, the dripping
  connection cut;
- uploads not started when the tier closes are cancelled (their buffers
  released); a process whose upload still drips when it closes exits (the
  remote tier's threads never hold the interpreter's exit, even on S3, which
  cannot cut a call);
- a listing (``ls``, ``stats``, ``purge``) fails within the bound with
  ``RemoteCatalogError`` (the CLI: a warning, exit 1); a listing that does not
  drip is whole however many bounded steps it takes;
- the scheduler's lookups, claims and deletes answer within the bound (None,
  True, False: the store could not answer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from lmcache_ec import ECCache
from lmcache_ec.cli import app
from lmcache_ec.config import load_config
from lmcache_ec.remote import catalog as catalog_module
from lmcache_ec.remote.catalog import RemoteCatalogError, open_catalog
from lmcache_ec.remote.deadline import DaemonPool
from tests.conftest import make_tensor
from tests.remote.conftest import TIMEOUT, outage_config, remote_config
from tests.servers import Drip

REPO = Path(__file__).resolve().parents[2]
BOUND = TIMEOUT + 1.5  # a call's bound (TIMEOUT + 0.5 s) with a generous margin
EXIT_BOUND = 60  # a child's import, start and close on a loaded machine; a hang is for ever
NAME = "ec1.a.b." + "0" * 64
# A Redis that answers everything an engine asks at once, except ``drip_on``.
WRITES_DRIP = {
    b"MULTI": b"+OK\r\n",
    b"SET": b"+QUEUED\r\n",
    b"EXISTS": b":0\r\n",
    b"GETRANGE": b"$0\r\n\r\n",
    b"SCAN": b"*2\r\n$1\r\n0\r\n*0\r\n",
}


@pytest.fixture
def drip():
    servers: list[Drip] = []

    def start(protocol: str, drip_on: bytes = b"GETRANGE", replies=None) -> Drip:
        servers.append(Drip(protocol, TIMEOUT / 5, drip_on, replies))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _config(kind: str, server: Drip, **extra) -> dict:
    if kind == "redis":
        return outage_config(f"redis://127.0.0.1:{server.port}", **extra)
    endpoint = f"http://127.0.0.1:{server.port}"
    return outage_config("s3://bucket/p", endpoint=endpoint, **extra)


def _answer_within(bound: float, call, *args):
    """``call(*args)``'s result, or the exception it raised; fails if it still
    runs after ``bound`` seconds."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = call(*args)
        except Exception as exc:
            box["result"] = exc

    thread = threading.Thread(target=run, name="bounded-call", daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"{call} still blocked after {bound} s"
    return box["result"]


def _poll(predicate, bound: float) -> bool:
    event = threading.Event()
    for _ in range(int(bound / 0.02)):
        if predicate():
            return True
        event.wait(0.02)
    return predicate()


# -- uploads ------------------------------------------------------------------


def test_a_write_whose_reply_drips_is_given_up_and_cut_within_the_bound(drip):
    server = drip("redis", drip_on=b"EXEC", replies=WRITES_DRIP)
    # No probe within the test: a reconnection would make the tier available again.
    config = _config("redis", server, remote_retry_interval=3600)
    cache = ECCache.from_config(config, model="m")
    try:
        assert cache.put("dripped", make_tensor((8, 8), torch.float32))

        def remote() -> dict:
            return cache.stats.snapshot()["tiers"]["remote"]

        assert _poll(lambda: remote()["available"] is False, BOUND), remote()
        assert server.dripping.wait(BOUND) and server.cut.wait(BOUND)  # the write was cut
        assert remote()["awaiting_resend"] == 1  # re-sent once the tier answers again
        assert _poll(lambda: remote()["pending"] == 0, BOUND)
    finally:
        server.close()  # a write left dripping (the bug) ends: close() returns
        cache.close()


def test_a_closed_pool_cancels_the_uploads_it_had_not_started():
    # A cancelled upload never ran: its caller releases the frame's buffer.
    pool = DaemonPool(1, "t")
    release = threading.Event()
    running = pool.submit(release.wait, 5)
    queued = pool.submit(lambda: "never sent")
    pool.shutdown()
    assert queued.cancelled()
    release.set()
    assert running.result(5) is True  # the call in progress ends as it would
    with pytest.raises(RuntimeError):
        pool.submit(lambda: "after close")


def _exited(script: str, config: dict) -> list[str]:
    """The lines ``script`` printed, run in a process that must exit by itself."""
    try:
        child = subprocess.run(
            [sys.executable, "-c", script, json.dumps(config)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "LMCACHE_LOG_LEVEL": "WARNING"},
            timeout=EXIT_BOUND,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit; its output: {exc.stdout!r}")
    assert child.returncode == 0, child.stderr[-3000:]
    return child.stdout.splitlines()


_CHILD = """
import json, sys, time, torch
from lmcache_ec import ECCache
cache = ECCache.from_config(json.loads(sys.argv[1]), model="m")
cache.put("dripped", torch.ones(8, 8))
time.sleep(0.5)  # the upload is on the wire, its reply dripping
cache.close()
print("closed", flush=True)
"""


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_a_process_whose_upload_drips_when_it_closes_exits(kind, drip, aws_env):
    # The write is still dripping at close (a long remote_timeout, a short
    # close_timeout); S3 cannot cut it: its thread must not hold the exit.
    server = drip("redis", b"EXEC", WRITES_DRIP) if kind == "redis" else drip("http")
    config = _config(kind, server, remote_timeout=30, close_timeout=0.5)
    assert _exited(_CHILD, config) == ["closed"]
    assert server.dripping.wait(BOUND)  # it closed while the answer was dripping


_LOOKUP_CHILD = """
import json, sys
from lmcache_ec.config import load_config
from lmcache_ec.remote.catalog import open_catalog
catalog = open_catalog(load_config(json.loads(sys.argv[1])))
print(catalog.lookup_many(["a", "b"]), flush=True)  # side by side: S3 has no batch call
catalog.close()
"""


def test_a_process_whose_batched_s3_lookup_drips_exits(drip, aws_env):
    server = drip("http")
    assert _exited(_LOOKUP_CHILD, _config("s3", server)) == ["[None, None]"]


# -- listings -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_a_listing_whose_page_drips_fails_within_the_bound(kind, drip, aws_env):
    server = drip("redis", b"SCAN") if kind == "redis" else drip("http")
    with open_catalog(load_config(_config(kind, server))) as catalog:
        failure = _answer_within(BOUND, lambda: list(catalog.list()))
        assert isinstance(failure, RemoteCatalogError), failure
        assert server.dripping.wait(BOUND)
        if kind == "redis":  # the abandoned page was cut, not left to drip
            assert server.cut.wait(BOUND)


def test_ls_of_a_tier_whose_listing_drips_warns_and_exits_1(drip, tmp_path):
    server = drip("redis", drip_on=b"SCAN")
    config = tmp_path / "ec.yaml"
    config.write_text(yaml.safe_dump({"ec": _config("redis", server)}))
    runner = CliRunner()
    result = _answer_within(
        4 * BOUND, runner.invoke, app, ["ls", "--config", str(config), "--tier", "remote"]
    )
    assert result.exit_code == 1, result.output
    assert "remote tier skipped: listing the remote tier failed" in " ".join(result.output.split())


def test_a_listing_longer_than_one_bounded_step_is_whole(remote, make_cache, monkeypatch):
    monkeypatch.setattr(catalog_module, "LIST_STEP", 2)
    config = remote_config(**remote)
    with make_cache(config, model="m") as cache:
        tensors = {f"h{i}": make_tensor((2, 4), torch.float32, seed=i) for i in range(5)}
        cache.put_many(tensors)
        assert cache.flush(10)
        names = {cache.key(h).storage_name for h in tensors}
    with open_catalog(load_config(config)) as catalog:
        listed = list(catalog.list())
        assert {name for name, _ in listed} == names and len(listed) == len(names)
        for _ in catalog.list():
            break  # a listing left early leaves the catalog usable
        assert dict(catalog.list()).keys() == names


# -- lookups, claims, deletes -----------------------------------------------------


def test_lookups_whose_answer_drips_are_unanswered_within_the_bound(drip):
    server = drip("redis", drip_on=b"EXISTS")
    with open_catalog(load_config(_config("redis", server))) as catalog:
        assert _answer_within(BOUND, catalog.lookup, NAME) is None
        assert server.cut.wait(BOUND)  # the lookup thread is free, the connection cut
        assert _answer_within(BOUND, catalog.lookup_many, [NAME, NAME + "1"]) == [None, None]
        assert "LateAnswer" in catalog.last_error


def test_a_claim_and_a_delete_whose_answer_drips_are_given_up_within_the_bound(drip):
    claim_drips = drip("redis", drip_on=b"EVALSHA")
    delete_drips = drip("redis", drip_on=b"DEL")
    with open_catalog(load_config(_config("redis", claim_drips))) as catalog:
        assert _answer_within(BOUND, catalog.claim, NAME, 60.0) is True  # go ahead
        assert claim_drips.dripping.wait(BOUND)
    with open_catalog(load_config(_config("redis", delete_drips))) as catalog:
        assert _answer_within(BOUND, catalog.delete, NAME) is False
        assert delete_drips.dripping.wait(BOUND)


def test_an_abandoned_s3_call_frees_its_thread_within_the_timeout(black_hole, aws_env):
    """S3 calls cannot be cut: one given up at its bound ends at botocore's read
    timeout, which is remote_timeout, so the catalog's threads come back and the
    next call reaches the server (not "every thread busy" for a minute)."""
    endpoint = f"http://127.0.0.1:{black_hole.port}"
    with open_catalog(load_config(outage_config("s3://bucket/p", endpoint=endpoint))) as catalog:
        for n in range(catalog_module.READERS):  # each thread left in a silent call
            assert catalog.lookup(f"silent-{n}") is None
        reached = len(black_hole.accepted)
        deadline = time.monotonic() + 10 * TIMEOUT
        while len(black_hole.accepted) == reached and time.monotonic() < deadline:
            assert catalog.lookup("again") is None
        assert len(black_hole.accepted) > reached, "the abandoned calls still hold every thread"
