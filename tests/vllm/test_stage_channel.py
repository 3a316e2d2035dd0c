"""Stage orders over the stage channel: hits on Model Runner V1 with an idle engine.

V1 runs no EC connector hook in a step with no scheduled tokens, so a lone
request deferred for staging used to be encoded again. These tests run vLLM's
real Scheduler with V1's call pattern (the harness returns before any hook in
an empty step) and requests that arrive one at a time.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from types import SimpleNamespace

import pytest

from lmcache_ec.integration.vllm.channel import StageListener
from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.index import TierIndex
from lmcache_ec.integration.vllm.items import ItemState
from lmcache_ec.integration.vllm.scheduler import TierScheduler
from lmcache_ec.integration.vllm.stage_client import StageClient
from lmcache_ec.integration.vllm.stage_messages import StageAnswer, WeightsAnnouncement
from lmcache_ec.key import EncoderIdentity
from lmcache_ec.runtime_dirs import socket_dir, socket_path
from tests.conftest import bit_equal

from .harness import Engine, encoder_output, image_hash, lone_request, make_vllm_config


def _store(model_config, extra: dict, images: list[str]) -> None:
    """A first instance encodes ``images`` and saves them to the shared tiers."""
    engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner="v1")
    try:
        for image in images:
            engine.run_until_finished([engine.add_request([image])])
        assert sorted(engine.encoded) == sorted(images)
        engine.flush()
    finally:
        engine.shutdown()


def _one_at_a_time(engine: Engine, images: list[str]) -> list[int]:
    """Send each image alone on an idle engine; the step each was first scheduled in."""
    first_steps = []
    for image in images:
        request = engine.add_request([image])
        start = len(engine.scheduled)
        engine.run_until_finished([request])
        first_steps.append(
            next(i for i, step in enumerate(engine.scheduled[start:]) if request in step)
        )
    return first_steps


def test_lone_requests_load_from_disk_on_v1(model_config, extra):
    images = [image_hash(f"lone-{i}.png") for i in range(3)]
    _store(model_config, extra, images)
    engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner="v1")
    try:
        first_steps = _one_at_a_time(engine, images)
        assert engine.encoded == []  # every stored image loaded, none encoded
        for image in images:
            assert bit_equal(engine.gathered[image], encoder_output(image))
        # The scheduler waited for the staging answer: no step was lost to deferral.
        assert first_steps == [0, 0, 0]
        assert engine.ec_stats["loads"] == 3
        assert engine.ec_stats.get("scheduler_stage_given_up", 0) == 0
        assert engine.ec_stats.get("load_direct_reads", 0) == 0
    finally:
        engine.shutdown()


@pytest.mark.parametrize("role", ["ec_both", "ec_consumer"])
def test_lone_requests_load_from_redis_on_v1(model_config, redis_url, role):
    remote = {
        "lmcache_config": {"max_local_cpu_size": 0.01, "remote_url": redis_url},
        "remote_lookup_timeout_s": 5.0,
    }
    images = [image_hash(f"redis-lone-{role}-{i}.png") for i in range(2)]
    _store(model_config, remote, images)
    engine = Engine(make_vllm_config(model_config, role, remote), runner="v1")
    try:
        _one_at_a_time(engine, images)
        assert engine.encoded == []  # remote hits images encoded: 0
        for image in images:
            assert bit_equal(engine.gathered[image], encoder_output(image))
        assert engine.ec_stats["hits_remote"] == 2
        assert engine.ec_stats.get("scheduler_unavailable_requests", 0) == 0
    finally:
        engine.shutdown()


def test_busy_engine_waits_briefly_then_defers(model_config, extra):
    """With a request running, the wait is bounded by ``busy_stage_wait_s``."""
    image = image_hash("busy.png")
    _store(model_config, extra, [image])
    slow = {**extra, "busy_stage_wait_s": 0.0}  # never delay the running batch
    engine = Engine(make_vllm_config(model_config, "ec_both", slow), runner="v1")
    try:
        busy = engine.add_request([], max_tokens=50)
        engine.step()
        request = engine.add_request([image])
        engine.run_until_finished([request])
        first = next(i for i, step in enumerate(engine.scheduled) if request in step)
        assert all(busy in step for step in engine.scheduled[: first + 1])
        assert first >= 2  # deferred a step: no wait was allowed
        assert engine.encoded == []
        assert bit_equal(engine.gathered[image], encoder_output(image))
        engine.run_until_finished([busy])
    finally:
        engine.shutdown()


def test_a_request_let_through_makes_the_rest_of_its_step_busy(model_config, extra):
    """Two requests arrive at an idle engine: once the first is let through, vLLM
    is scheduling it, so the second's staging may not hold that step for the
    idle budget; it waits at most the busy budget and loads a step later."""
    first, second = image_hash("let-through.png"), image_hash("behind-it.png")
    _store(model_config, extra, [first, second])
    budgets = {**extra, "idle_stage_wait_s": 30.0, "busy_stage_wait_s": 0.0}
    engine = Engine(make_vllm_config(model_config, "ec_both", budgets), runner="v1")
    worker_cache = engine.workers[0].worker.cache
    get_many = worker_cache.get_many

    def slow_for_second(identifiers, *args, **kwargs):
        if second in identifiers:
            time.sleep(0.5)  # far under the idle budget, far over the busy one
        return get_many(identifiers, *args, **kwargs)

    worker_cache.get_many = slow_for_second
    try:
        requests = [engine.add_request([first]), engine.add_request([second])]
        engine.run_until_finished(requests)
        first_steps = [
            next(i for i, step in enumerate(engine.scheduled) if request in step)
            for request in requests
        ]
        assert first_steps[0] == 0  # the first loaded in the step it arrived
        assert first_steps[1] > 0  # the second did not hold that step for its read
        assert engine.encoded == []  # and still loaded, in a later step
        for image in (first, second):
            assert bit_equal(engine.gathered[image], encoder_output(image))
    finally:
        engine.shutdown()


def test_without_a_channel_orders_ride_step_metadata(model_config, extra, monkeypatch):
    """A rank the scheduler cannot reach: the old path, never a failed request.

    Without the channel the scheduler hears no weights fingerprint, so this
    path needs explicit weights versions (``weights_fingerprint: false``).
    """
    image = image_hash("no-channel.png")
    extra = {**extra, "weights_fingerprint": False}
    _store(model_config, extra, [image])
    config = make_vllm_config(model_config, "ec_both", extra)
    with monkeypatch.context() as patch:  # the runner that delivers idle steps
        patch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # (VllmConfig refuses it without Triton)
        engine = Engine(config, runner="v2")
    engine.workers[0]._listener.close()
    try:
        request = engine.add_request([image])
        engine.run_until_finished([request])
        assert [image] in engine.stage_orders  # sent in step metadata
        assert not engine.connector.scheduler.channel.connected
        assert engine.encoded == []
        assert bit_equal(engine.gathered[image], encoder_output(image))
    finally:
        engine.shutdown()


def test_an_idle_step_give_up_does_not_hold_the_image_off_a_busy_engine(model_config, extra):
    """V1 without a channel: an order in an idle step's metadata never reaches the
    workers, so that request encodes its image. Nothing failed, so the image is
    not held off the tiers for ``failed_retry_s``: once vLLM's encoder cache lost
    it, a request on a busy engine (whose steps do reach the workers) loads it."""
    image = image_hash("idle-give-up.png")
    extra = {**extra, "weights_fingerprint": False, "failed_retry_s": 600.0}
    _store(model_config, extra, [image])
    engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner="v1")
    engine.workers[0]._listener.close()
    try:
        engine.run_until_finished([engine.add_request([image])])
        assert not engine.connector.scheduler.channel.connected
        assert engine.encoded == [image]  # given up: the idle step dropped its order
        assert engine.ec_stats["scheduler_stage_given_up"] == 1
        engine.update_weights(engine.weights_seed)  # vLLM's encoder cache is emptied
        busy = engine.add_request([], max_tokens=200)
        engine.step()
        engine.run_until_finished([engine.add_request([image])])
        assert engine.encoded == [image]  # loaded this time, not encoded again
        assert bit_equal(engine.gathered[image], encoder_output(image))
        assert engine.ec_stats["loads"] == 1
        engine.run_until_finished([busy])
    finally:
        engine.shutdown()


def test_an_order_made_after_an_idle_step_waits_for_its_own_step():
    """V1 without a channel: an idle step's metadata never reaches the workers, so
    the requests of orders it held back give them up. An order made after it
    rides the next step's metadata: a busy step delivers it, and it is not given
    up for the idle step before it (as when a decode keeps the engine busy)."""
    index = TierIndex(
        EncoderIdentity(model="m"), disk_dir=None, open_catalog=None, negative_ttl=5.0
    )
    scheduler = TierScheduler(
        ConnectorSettings(idle_stage_wait_s=0.0, busy_stage_wait_s=0.0),
        index,
        is_producer=True,
        is_consumer=True,
        tp_size=1,
        deliver_on_idle=False,
    )
    try:
        scheduler.build_connector_meta(SimpleNamespace(total_num_scheduled_tokens=0))  # idle
        image = image_hash("after-an-idle-step.png")
        index.note_present(image, "worker")
        assert not scheduler.ensure_cache_available(lone_request(image), 0)  # waits
        assert scheduler.items.state(image) is ItemState.STAGING
        busy = scheduler.build_connector_meta(SimpleNamespace(total_num_scheduled_tokens=1))
        assert busy.stage == [image]  # delivered
        assert not scheduler.ensure_cache_available(lone_request(image), 0)
        assert scheduler.take_stats().get("scheduler_stage_given_up", 0) == 0
    finally:
        index.close()


def test_two_engines_on_one_host_each_get_only_their_own_orders(model_config, extra):
    """Each engine's sockets are named by its engine id: two instances on one
    host never stage, or answer, each other's orders."""
    images = [image_hash(f"two-engines-{i}.png") for i in range(4)]
    _store(model_config, extra, images)
    engines = [Engine(make_vllm_config(model_config, "ec_both", extra), runner="v1") for _ in "ab"]
    staged_by: list[list[str]] = [[], []]
    try:
        paths = {engine.workers[0]._listener.path for engine in engines}
        assert len(paths) == 2  # one socket per engine, both listening
        for engine, staged in zip(engines, staged_by, strict=True):
            stage = engine.workers[0].worker.stage

            def record(identifiers, weights, link, *rest, stage=stage, staged=staged, **rows):
                staged.extend(identifiers)
                stage(identifiers, weights, link, *rest, **rows)

            engine.workers[0].worker.stage = record
        for engine, mine in zip(engines, (images[:2], images[2:]), strict=True):
            _one_at_a_time(engine, mine)
        assert staged_by == [images[:2], images[2:]]
        for engine, mine in zip(engines, (images[:2], images[2:]), strict=True):
            assert engine.encoded == []
            assert engine.ec_stats["loads"] == 2
            assert engine.ec_stats.get("load_direct_reads", 0) == 0
            for image in mine:
                assert bit_equal(engine.gathered[image], encoder_output(image))
    finally:
        for engine in engines:
            engine.shutdown()


def test_a_hostile_peer_at_a_running_engine_is_counted_and_changes_nothing(model_config, extra):
    """A bad frame on the worker's socket closes that link only; the counter
    reaches vLLM's stats (and so ``/metrics``) and the engine keeps loading."""
    images = [image_hash(f"hostile-{i}.png") for i in range(2)]
    _store(model_config, extra, images)
    engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner="v1")
    try:
        _one_at_a_time(engine, images[:1])
        listener = engine.workers[0]._listener

        def links_become(count: int) -> bool:
            deadline = time.monotonic() + 5.0
            while listener.links != count and time.monotonic() < deadline:
                time.sleep(0.01)
            return listener.links == count

        hostile = socket.socket(socket.AF_UNIX)
        hostile.connect(listener.path)
        assert links_become(2)  # the scheduler's link and this one
        hostile.sendall(b"\x00\x00\x00\x02[]")
        assert links_become(1)
        hostile.close()
        _one_at_a_time(engine, images[1:])
        assert engine.encoded == []
        assert engine.ec_stats["loads"] == 2
        assert engine.ec_stats["channel_bad_frames"] == 1
        assert engine.ec_stats.get("scheduler_channel_breaks", 0) == 0
    finally:
        engine.shutdown()


# -- the channel itself ------------------------------------------------------


def test_socket_directory_is_private():
    path = socket_dir()
    info = os.lstat(path)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
    assert info.st_mode & 0o077 == 0


def test_orders_and_answers_round_trip(tmp_path):
    path = socket_path(f"test-{os.getpid()}-{time.monotonic_ns()}", 0, 0)
    received: list[list[str]] = []

    def on_order(identifiers, weights, link, rows):
        received.append((identifiers, weights))
        link.answer(staged=identifiers[:1], failed=identifiers[1:], weights=weights)

    listener = StageListener(path, on_order, hello=lambda: WeightsAnnouncement("w1"))
    client = StageClient([path])
    try:
        assert client.connect()
        assert client.receive(timeout=5.0) == [WeightsAnnouncement("w1")]  # the hello
        assert client.send(["../../x", "b"], "w1")
        deadline = time.monotonic() + 5.0
        answers = []
        while not answers and time.monotonic() < deadline:
            answers = client.receive(timeout=1.0)
        assert answers == [StageAnswer(staged=("../../x",), failed=("b",), weights="w1")]
        assert received == [(["../../x", "b"], "w1")]
        assert listener.broadcast(WeightsAnnouncement(None))
        assert client.receive(timeout=5.0) == [WeightsAnnouncement(None)]
    finally:
        client.close()
        listener.close()
    assert not os.path.exists(path)


def test_stale_socket_is_replaced_and_a_live_one_refused():
    path = socket_path(f"stale-{os.getpid()}-{time.monotonic_ns()}", 0, 0)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)
    dead.close()  # the file stays, nobody listens: a crashed worker's leftover
    listener = StageListener(path, lambda identifiers, weights, link, rows: None)
    try:
        with pytest.raises(OSError, match="another process listens"):
            StageListener(path, lambda identifiers, weights, link, rows: None)
    finally:
        listener.close()


def test_client_without_listeners_is_not_connected():
    client = StageClient([socket_path(f"absent-{os.getpid()}", 0, 0)])
    assert not client.connect()
    assert not client.send(["a"])
    assert client.receive(0.0) == []


def test_encode_only_instance_reports_its_saves_on_v1(model_config, extra):
    """V1 drops an encode-only step's worker metadata; the report takes the channel."""
    images = [image_hash(f"producer-{i}.png") for i in range(3)]
    engine = Engine(make_vllm_config(model_config, "ec_producer", extra), runner="v1")
    try:
        engine.run_until_finished([engine.add_request([image]) for image in images[:2]])
        engine.flush()
        # Saves finish in the background: their puts are reported with the next step.
        engine.run_until_finished([engine.add_request([images[2]])])
        assert engine.ec_stats["saves_submitted"] == 3
        assert engine.ec_stats["puts"] >= 2
    finally:
        engine.shutdown()
