"""Real serving: a restarted or other instance loads encoder outputs, never re-encodes.

Servers and reference answers come from ``conftest.fleet``: writers encoded
``IMAGES`` on empty tiers and stopped; each reader is a fresh process that
must answer the same images with the same tokens and logprobs (temperature
0) while its encoder runs for none of them: the connector's
``vllm:lmcache_ec_saves_total`` (every encoder output is handed to it) stays
put, ``vllm:lmcache_ec_loads_total`` and the tier's
``vllm:lmcache_ec_hits_total`` grow by one per image, and vLLM's own
``vllm:prompt_tokens_cached_total`` does not move (no prefix-cache hit hid
the encoder).

Two arrival patterns: requests sent while another request is in a long
decode (the engine steps continuously), and a lone request on an idle engine
(each request waits for the previous one).
"""

from __future__ import annotations

import time

import pytest

from lmcache_ec.bench.vllm_server import BackgroundDecode, metric_total, read_metrics

from .conftest import (
    BACKGROUND_TOKENS,
    BUSY_IMAGES,
    IMAGES,
    LONE_IMAGES,
    ask,
    counters,
    settled_counters,
)

# Tokens per image request during the long decode: every decode step then
# runs two requests, and on a loaded 2-core machine vLLM's CPU steps of such
# batches stall for seconds at a time (seen without a connector too). The
# first tokens carry the whole prefill, encoder output included.
BUSY_TOKENS = 2

# The first test also pays for the session's server starts (two waves).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

READERS = ("disk", "redis", "s3", "consumer")
# Which counter shows a reader's hits: its own disk directory was written by
# the writer ("disk"), the others start with empty disks and read the remote.
HIT_COUNTER = {
    "disk": "hits_disk",
    "redis": "hits_lower",
    "s3": "hits_lower",
    "consumer": "hits_lower",
}


def test_writers_encoded_every_image_once(fleet):
    for name in ("a", "a_s3"):
        seen = fleet.writer_counters[name]
        assert seen["saves"] == len(IMAGES), (name, seen)
        assert seen["loads"] == 0, (name, seen)
    assert len(list(fleet.disk_a.glob("*.pt"))) == len(IMAGES)


def test_producer_reports_its_saves_on_metrics(fleet):
    # The consumer tests show the producer's outputs reached Redis; its own
    # /metrics must count them too (V1 returns an encoder-only runner output).
    seen = fleet.writer_counters["producer"]
    assert seen["saves"] == len(IMAGES), seen


def test_distinct_images_give_distinct_logprobs(fleet):
    answers = [fleet.reference[image] for image in IMAGES]
    for answer in answers:
        assert len(answer.tokens) == len(answer.logprobs) > 0
    for i, first in enumerate(answers):
        for second in answers[i + 1 :]:
            assert first.logprobs != second.logprobs
            assert first.top_logprobs[0] != second.top_logprobs[0]


def _check_loaded(fleet, reader: str, images, results, change, tokens: int | None = None) -> None:
    """``tokens``: the requests asked for only that many, compared with the
    reference's first ones (else all of them)."""
    for image in images:
        got, expected = results[image], fleet.reference[image]
        n = len(expected.tokens[:tokens])  # [:None]: all of them
        assert len(got.tokens) == n, (reader, image)
        assert got.tokens == expected.tokens[:n], (reader, image)
        assert got.logprobs == expected.logprobs[:n], (reader, image)
        assert got.top_logprobs == expected.top_logprobs[:n], (reader, image)
    n = len(images)
    server = fleet.servers[reader]
    assert change["saves"] == 0, f"{reader}: the encoder ran ({change}){_connector_log(server)}"
    assert change["loads"] == n, (
        f"{reader}: outputs not loaded from the tiers ({change}){_connector_log(server)}"
    )
    assert change[HIT_COUNTER[reader]] >= n, f"{reader}: no tier hits ({change})"
    assert change["prefix_cached_tokens"] == 0, change


# What the connector logs about its decisions: why an item was encoded, a
# remote tier that did not answer, its periodic counters.
_CONNECTOR_LINES = ("Encoder output", "Remote", "EC Transfer metrics", "Claim", "WARNING")


def _connector_log(server, lines: int = 40) -> str:
    """The server log's connector lines, newest last (for a failure message)."""
    tail = server.log_tail(5000).splitlines()
    kept = [line for line in tail if any(word in line for word in _CONNECTOR_LINES)]
    return f"\n--- {server.log_path}: connector lines ---\n" + "\n".join(kept[-lines:])


def _wait_idle(server, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = read_metrics(server.metrics_url)
        if not metric_total(page, "vllm:num_requests_running") and not metric_total(
            page, "vllm:num_requests_waiting"
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"{server.base_url} still busy after {timeout}s")


@pytest.mark.parametrize("reader", READERS)
def test_requests_during_a_long_decode_load_from_the_tiers(fleet, reader):
    server = fleet.servers[reader]
    _wait_idle(server)
    before = counters(server)
    with BackgroundDecode(
        server.base_url, server.served_model, max_tokens=BACKGROUND_TOKENS
    ) as decode:
        results = {image: ask(server, image, max_tokens=BUSY_TOKENS) for image in BUSY_IMAGES}
        still_decoding = decode.running
    assert still_decoding, (
        "the background decode ended before the image requests did: "
        f"{decode.tokens} tokens, finished={decode.finished}, error={decode.error!r}"
    )
    change = settled_counters(server, before, len(BUSY_IMAGES))
    _check_loaded(fleet, reader, BUSY_IMAGES, results, change, tokens=BUSY_TOKENS)


@pytest.mark.parametrize("reader", READERS)
def test_lone_requests_on_an_idle_engine_load_from_the_tiers(fleet, reader):
    server = fleet.servers[reader]
    results = {}
    before = counters(server)
    for image in LONE_IMAGES:
        _wait_idle(server)
        results[image] = ask(server, image)
    change = settled_counters(server, before, len(LONE_IMAGES))
    _check_loaded(fleet, reader, LONE_IMAGES, results, change)
