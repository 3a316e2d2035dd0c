"""A real ``vllm serve`` whose runtime directory another user took before it started.

Before the server starts, uid 65534 makes ``<node_dir>/lmcache-ec-<uid>``,
and a file stands where the server's token would be kept, so no private
alternative can be had: the node tier, the shared size
ledger and the stage channel can have no directory of this user's. The server must start, serve
from the tiers (an image asked again once vLLM's own encoder cache let it
go is loaded, not encoded; its output was written to disk), and say in its
log and on ``/metrics`` which features are off and why. One server, started
with the fleet's readers.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lmcache_ec.bench.vllm_server import (
    BackgroundDecode,
    VLLMServer,
    ec_transfer_config,
    read_metrics,
)

from .conftest import ARGS, BACKGROUND_TOKENS, Site, ask, companion, counters, settled_counters

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="needs root: the squatter's directories are made as uid 65534"
    ),
]

SQUATTER = 65534
IMAGE, OTHERS = 107, (108, 109)  # image seeds no other e2e test uses
BUSY_TOKENS = 2  # beside a long decode, CPU steps of two requests are slow
ATTEMPTS = 6  # each a few seconds; one in a step with no tokens proves nothing
# vLLM's encoder cache holds max_num_batched_tokens embeddings: two images of
# the tiny model (32 each), so a third one evicts the first. No prefix cache:
# it would skip the image's tokens, encoder and connector alike.
SERVER_ARGS = (
    *ARGS,
    "--max-num-batched-tokens",
    "64",
    "--max-num-seqs",
    "4",
    "--no-enable-prefix-caching",
    # The background decode's stream in chunks of 50 tokens: one a token kept the
    # API server so far behind a fast engine that the image's request arrived only
    # once the decode had ended.
    "--stream-interval",
    "50",
)


def _squat(path: Path) -> None:
    path.mkdir()
    os.chmod(path, 0o777)
    os.chown(path, SQUATTER, SQUATTER)


def _squatted_server(site: Site) -> tuple[VLLMServer, tuple[Path, list[Path]]]:
    root = site.root
    base = root / "shm"
    base.mkdir(parents=True)
    os.chmod(base, 0o1777)
    taken = [base / f"lmcache-ec-{os.getuid()}"]
    for path in taken:
        _squat(path)
    home = root / "home"
    home.joinpath(".config").mkdir(parents=True)
    home.joinpath(".config", "lmcache-ec").write_text("")  # no token can be kept
    tiers = {
        "local_cpu": True,
        "max_local_cpu_size": 0.25,
        "local_disk": str(root / "disk"),
        "max_local_disk_size": 1.0,
        "node_tier": True,
        "node_dir": str(base),
    }
    server = site.server(
        "squatted",
        ec_transfer_config("ec_both", tiers),
        extra_args=SERVER_ARGS,
        HOME=str(home),
        XDG_RUNTIME_DIR=None,
    )
    return server, (root, taken)


if os.geteuid() == 0:  # started with the fleet's readers (conftest.py)
    companion("squatted")(_squatted_server)


@contextmanager
def _decoding(server: VLLMServer) -> Iterator[list[int]]:
    """Background decodes, one after another, until the block ends: the engine
    decodes however long the image's request takes to reach it. Yields the
    tokens each read."""
    stop, started = threading.Event(), threading.Event()
    tokens: list[int] = []
    failed: list[BaseException] = []

    def one_after_another() -> None:
        try:
            while not stop.is_set():
                with BackgroundDecode(
                    server.base_url, server.served_model, max_tokens=BACKGROUND_TOKENS
                ) as decode:
                    started.set()
                    while decode.running and not stop.wait(0.05):
                        pass
                tokens.append(decode.tokens)
        except BaseException as exc:  # reported below, in the test's thread
            failed.append(exc)
        finally:
            started.set()

    thread = threading.Thread(target=one_after_another, name="decodes", daemon=True)
    thread.start()
    started.wait(180)
    try:
        assert not failed, failed
        yield tokens
    finally:
        stop.set()
        thread.join(60)


@pytest.fixture
def squatted(fleet):
    root, taken = fleet.companions["squatted"]
    return fleet.servers["squatted"], root, taken


def test_a_server_whose_runtime_directory_was_taken_starts_and_serves_from_disk(squatted):
    server, root, taken = squatted
    before = counters(server)
    first = ask(server, IMAGE)
    change = settled_counters(server, before, 1)
    assert (change["saves"], change["loads"]) == (1, 0), change  # encoded and saved

    # A running decode keeps the engine busy, so orders and answers ride step
    # metadata (no stage channel) on Model Runner V1. V1 still runs a step with
    # no tokens now and then; an order made in such a step never reaches the
    # workers and the image is encoded, by design. Such an attempt proves
    # nothing and is made again (the image is not held off the tiers after it:
    # nothing failed).
    attempts: list[dict] = []
    for _ in range(ATTEMPTS):
        settled = counters(server)
        for other in OTHERS:  # the second one makes vLLM's encoder cache let IMAGE go
            ask(server, other)
        settled_counters(server, settled, len(OTHERS))  # their stats before the baseline
        before = counters(server)
        with _decoding(server):
            again = ask(server, IMAGE, max_tokens=BUSY_TOKENS)
        change = settled_counters(server, before, 1)
        attempts.append(change)
        if change["loads"] >= 1:
            break
    assert (change["saves"], change["loads"]) == (0, 1), attempts  # a hit, loaded
    assert change["hits_cpu"] + change["hits_disk"] >= 1, change
    assert change["prefix_cached_tokens"] == 0, change
    assert again.logprobs == first.logprobs[:BUSY_TOKENS]  # the same encoder output

    written = 1 + len(OTHERS)  # the disk writes landed (written in the background)
    deadline = time.monotonic() + 10
    while len(list((root / "disk").glob("*.pt"))) < written and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(list((root / "disk").glob("*.pt"))) == written
    for path in taken:
        assert os.listdir(path) == []  # nothing read or written there

    log = Path(server.log_path).read_text(errors="replace")
    # One line per process that met it: the worker (node tier, ledger, its
    # socket) and the scheduler (its socket), in processes of their own here.
    for feature, processes in (("node_tier", 1), ("shared_ledger", 1), ("stage_channel", 2)):
        lines = [line for line in log.splitlines() if f"{feature} off: {taken[0]}" in line]
        assert len(lines) == processes, (feature, lines)
        assert all("belongs to uid 65534 (nobody), not this user" in line for line in lines)

    page = read_metrics(server.metrics_url)
    off = {
        (labels["feature"], labels["reason"]): value
        for labels, value in page.get("vllm:lmcache_ec_feature_off", [])
        if value
    }
    # One worker rank; the stage channel is off on the scheduler's side too.
    assert off == {
        ("node_tier", "directory_taken"): 1,
        ("shared_ledger", "directory_taken"): 1,
        ("stage_channel", "directory_taken"): 2,
    }, json.dumps({f"{k[0]}/{k[1]}": v for k, v in off.items()})
