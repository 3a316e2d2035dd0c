"""An item's record outlives neither its weights nor its request.

- A stage answer carries the weights its order was made under: a late one,
  made under weights since replaced, never moves an item ordered again
  under the new ones (the scheduler side, with a real stage channel whose
  worker end the test plays); nor does a step report made under them.
- A staged item whose request ended is released when its deadline passes:
  the worker's staged memory comes back (vLLM's real Scheduler).
- Claims made for a request that ended unencoded are withdrawn at once:
  another instance encodes the image without waiting out ``claim_wait_s``.
- No record outlives the requests that asked about it: a lookup, a claim or a
  wait for another instance's encode whose requests ended leaves the table
  at its answer or deadline, and a failed fetch at its retry time (else the
  table, and the scheduler's work per step, grow with every aborted request).
"""

from __future__ import annotations

import time

import pytest
from vllm.v1.request import RequestStatus

from lmcache_ec.integration.vllm.channel import StageListener
from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.index import TierIndex
from lmcache_ec.integration.vllm.items import ItemState
from lmcache_ec.integration.vllm.metadata import ECTierWorkerMetadata
from lmcache_ec.integration.vllm.scheduler import TierScheduler
from lmcache_ec.integration.vllm.stage_client import StageClient
from lmcache_ec.integration.vllm.stage_messages import WeightsAnnouncement
from lmcache_ec.key import EncoderIdentity
from tests.conftest import bit_equal

from .harness import (
    Engine,
    claimed_by_a_dead_process,
    encoder_output,
    image_hash,
    lone_request,
    make_vllm_config,
)

S = ItemState
OLD, NEW = "weights-1", "weights-2"
RETRY_S = 0.3  # failed_retry_s where a test waits it out


def _until(condition, poll, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        poll()
        time.sleep(0.005)


@pytest.fixture
def staging_under_new_weights(tmp_path):
    """A scheduler on weights NEW with two items STAGING over the stage channel,
    and the stage link the test answers them on (as the worker would)."""
    links = []
    path = str(tmp_path / "rank0.sock")
    listener = StageListener(
        path,
        lambda ids, weights, link, rows: links.append((ids, weights, link)),
        lambda: WeightsAnnouncement(NEW),
    )
    index = TierIndex(
        EncoderIdentity(model="m"), disk_dir=None, open_catalog=None, negative_ttl=5.0
    )
    scheduler = TierScheduler(
        ConnectorSettings(idle_stage_wait_s=0.0, busy_stage_wait_s=0.0, stage_timeout_s=60.0),
        index,
        is_producer=True,
        is_consumer=True,
        tp_size=1,
        deliver_on_idle=True,
        channel=StageClient([path]),
        weights_from_workers=True,
    )
    scheduler.build_connector_meta(object())  # connects; the worker announces NEW
    _until(lambda: scheduler.weights == NEW, scheduler.take_stats)
    late, control = image_hash("late.png"), image_hash("control.png")
    for identifier in (late, control):
        index.note_present(identifier, "worker")  # a worker saved it: prefetch it
        assert not scheduler.ensure_cache_available(lone_request(identifier), 0)
        assert scheduler.items.state(identifier) is S.STAGING
    _until(lambda: len(links) == 2, scheduler.channel.flush)
    assert all(weights == NEW for _, weights, _ in links)
    yield scheduler, links[0][2], late, control
    scheduler.channel.close()
    listener.close()
    index.close()


@pytest.mark.parametrize("answer", ["staged", "failed"])
def test_a_late_answer_under_old_weights_moves_nothing(staging_under_new_weights, answer):
    scheduler, link, late, control = staging_under_new_weights
    # The answer to an order made under OLD, before the update: then one under NEW.
    if answer == "staged":
        link.answer([late], [], OLD)
    else:
        link.answer([], [late], OLD)
    link.answer([control], [], NEW)
    _until(lambda: scheduler.items.state(control) is S.READY, scheduler.take_stats)
    # Both arrived, in order: the old one changed nothing.
    assert scheduler.items.state(late) is S.STAGING
    assert not scheduler.take_unavailable_requests()
    assert late not in scheduler.build_connector_meta(object()).release


@pytest.mark.parametrize("answer", ["staged", "failed"])
def test_a_step_report_under_old_weights_moves_nothing(staging_under_new_weights, answer):
    """The same answer in a step report (a worker no stage link took it from)."""
    scheduler, _, late, _ = staging_under_new_weights
    report = ECTierWorkerMetadata(weights=OLD)
    if answer == "staged":
        report.staged[late] = 1
    else:
        report.failed.add(late)
    scheduler.update_connector_output(report)
    assert scheduler.items.state(late) is S.STAGING
    assert not scheduler.take_unavailable_requests()
    assert late not in scheduler.build_connector_meta(object()).release


STAGE_TIMEOUT_S = 2.0  # long enough for a staging on a loaded machine


def _staged_past_its_deadline(model_config, extra, disk_dir, name: str, runner: str = "v2"):
    """An engine holding ``name``'s image staged (READY) for a request that ended,
    once the item's deadline has passed; the image's identifier."""
    stored, never = image_hash(name), image_hash("never-encoded.png")
    writer = Engine(make_vllm_config(model_config, "ec_both", extra))
    try:
        writer.run_until_finished([writer.add_request([stored])])
        writer.flush()
    finally:
        writer.shutdown()
    settings = {**extra, "claim_wait_s": 600.0, "stage_timeout_s": STAGE_TIMEOUT_S}
    engine = Engine(make_vllm_config(model_config, "ec_both", settings), runner=runner)
    scheduler = engine.connector.scheduler
    try:
        engine.step()  # the scheduler learns the encoder weights
        claimed_by_a_dead_process(engine, never, disk_dir)
        # Held back by the claimed image, the request waits while its other image
        # is staged.
        request = engine.add_request([never, stored])
        for _ in range(50):
            engine.step()
            if scheduler.items.state(stored) is S.READY:
                break
        assert scheduler.items.state(stored) is S.READY
        assert engine.workers[0].worker.staged_bytes > 0
        assert not any(request in step for step in engine.scheduled)
        engine.scheduler.finish_requests(request, RequestStatus.FINISHED_ABORTED)
        time.sleep(STAGE_TIMEOUT_S * 1.2)  # past the staged item's deadline
    except BaseException:
        engine.shutdown()
        raise
    return engine, stored


def test_a_staged_item_of_an_ended_request_is_released_at_its_deadline(
    model_config, extra, disk_dir
):
    engine, stored = _staged_past_its_deadline(
        model_config, extra, disk_dir, "staged-then-abandoned.png"
    )
    scheduler = engine.connector.scheduler
    worker = engine.workers[0].worker
    try:
        engine.run_until_finished([engine.add_request([])])  # steps that deliver orders
        assert scheduler.items.state(stored) is S.UNKNOWN
        assert worker.staged_bytes == 0
        assert engine.encoded == []
    finally:
        engine.shutdown()


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_an_item_asked_for_again_as_its_release_leaves_is_loaded_from_the_new_copy(
    model_config, extra, disk_dir, runner
):
    """A staged item unused past its deadline is released in the same step a new
    request orders it again: the release reaches the worker before the new order
    (both over the stage channel), so it never drops the new copy."""
    engine, stored = _staged_past_its_deadline(
        model_config, extra, disk_dir, f"released-then-asked-{runner}.png", runner
    )
    worker = engine.workers[0].worker
    try:
        engine.run_until_finished([engine.add_request([stored])])  # the client asks again
        assert engine.encoded == []
        assert bit_equal(engine.gathered[stored], encoder_output(stored))
        assert engine.ec_stats["loads"] == 1
        assert engine.ec_stats.get("load_direct_reads", 0) == 0  # the staged copy was there
        assert worker.staged_bytes == 0  # and both copies were accounted for
    finally:
        engine.shutdown()


def _scheduler_of_a_silent_worker(tmp_path, timeout: float):
    """A scheduler (ec_both: a fetch that failed holds the item off the tiers)
    on weights NEW, one prefetch in flight at most, and a worker that takes
    stage orders and never answers them."""
    orders: list[list[str]] = []
    listener = StageListener(
        str(tmp_path / "rank0.sock"),
        lambda ids, weights, link, rows: orders.append(ids),
        lambda: WeightsAnnouncement(NEW),
    )
    index = TierIndex(
        EncoderIdentity(model="m"), disk_dir=None, open_catalog=None, negative_ttl=5.0
    )
    scheduler = TierScheduler(
        ConnectorSettings(
            idle_stage_wait_s=0.0,
            busy_stage_wait_s=0.0,
            stage_timeout_s=timeout,
            max_inflight_items=1,
            failed_retry_s=RETRY_S,
        ),
        index,
        is_producer=True,
        is_consumer=True,
        tp_size=1,
        deliver_on_idle=True,
        channel=StageClient([str(tmp_path / "rank0.sock")]),
        weights_from_workers=True,
    )
    scheduler.build_connector_meta(object())  # connects; the worker announces NEW
    _until(lambda: scheduler.weights == NEW, scheduler.take_stats)

    def close() -> None:
        scheduler.channel.close()
        listener.close()
        index.close()

    return scheduler, index, close


def test_a_staging_no_request_waits_for_gives_its_slot_back_at_its_deadline(tmp_path):
    """A staging whose answer never comes and whose request ended is given up at
    its deadline: its slot in flight comes back, and the next item is ordered."""
    timeout = 0.3
    scheduler, index, close = _scheduler_of_a_silent_worker(tmp_path, timeout)
    try:
        lost, after = image_hash("answer-lost.png"), image_hash("next.png")
        for identifier in (lost, after):
            index.note_present(identifier, "worker")
        first = lone_request(lost)
        assert not scheduler.ensure_cache_available(first, 0)
        assert scheduler.items.state(lost) is S.STAGING
        scheduler.request_finished(first.request_id)  # the client went away
        time.sleep(timeout * 1.5)
        scheduler.build_connector_meta(object())  # a step past its deadline
        assert scheduler.items.state(lost) is S.FAILED
        assert scheduler.prefetch.inflight_items == 0
        assert not scheduler.ensure_cache_available(lone_request(after), 0)
        assert scheduler.items.state(after) is S.STAGING  # ordered: the slot was free
        assert not scheduler.take_unavailable_requests()
        time.sleep(RETRY_S * 1.5)
        scheduler.build_connector_meta(object())  # a step past its retry time
        assert scheduler.items.get(lost) is None  # the record went with it
    finally:
        close()


def test_a_staging_whose_request_ends_after_its_deadline_gives_its_slot_back(tmp_path):
    """The deadline passed while the request still waited (the step woke it);
    the request then ends before it looks again: the staging is given up then,
    not kept with its slot in flight until an answer that may never come."""
    timeout = 0.3
    scheduler, index, close = _scheduler_of_a_silent_worker(tmp_path, timeout)
    try:
        lost = image_hash("deadline-then-abort.png")
        index.note_present(lost, "worker")
        request = lone_request(lost)
        assert not scheduler.ensure_cache_available(request, 0)
        time.sleep(timeout * 1.5)
        scheduler.build_connector_meta(object())  # past its deadline: the request is woken
        assert scheduler.items.state(lost) is S.STAGING
        scheduler.request_finished(request.request_id)  # aborted before it looked again
        assert scheduler.prefetch.inflight_items == 0
        assert scheduler.items.state(lost) is not S.STAGING
    finally:
        close()


def test_a_queued_prefetch_whose_request_ended_is_not_held_off_the_tiers(tmp_path):
    """A prefetch still queued (never ordered: one in flight at most) when its
    request ends is given up at its deadline as nothing failed: the next
    request for the image fetches it, it is not computed for ``failed_retry_s``."""
    timeout = 0.3
    scheduler, index, close = _scheduler_of_a_silent_worker(tmp_path, timeout)
    try:
        first, queued = image_hash("in-flight.png"), image_hash("queued-then-aborted.png")
        index.note_present(first, "worker")
        index.note_present(queued, "worker")
        assert not scheduler.ensure_cache_available(lone_request(first), 0)
        request = lone_request(queued)
        request.request_id = "aborted"
        assert not scheduler.ensure_cache_available(request, 0)
        assert scheduler.items.state(queued) is S.QUEUED
        scheduler.request_finished(request.request_id)
        time.sleep(timeout * 1.5)
        scheduler.build_connector_meta(object())  # past its deadline, no request waits
        assert scheduler.items.state(queued) is S.UNKNOWN
        assert scheduler.items.retry_at(queued) == 0  # fetched again at once
    finally:
        close()


def test_an_item_staged_twice_counts_its_memory_once(model_config, extra):
    """A stage order for an item the worker holds already replaces the copy: the
    worker's staged bytes (bounded by ``max_staged_mb``) count it once."""
    image = image_hash("staged-twice.png")
    engine = Engine(make_vllm_config(model_config, "ec_both", extra))
    worker = engine.workers[0].worker
    answers: list[list[str]] = []

    class Link:  # the stage channel's link, as the worker answers on it
        def answer(self, staged: list[str], failed: list[str], weights: str) -> None:
            answers.append(staged)

    try:
        engine.run_until_finished([engine.add_request([image])])
        engine.flush()
        for count in (1, 2):
            worker.stage([image], worker.weights, Link())
            _until(lambda count=count: len(answers) == count, lambda: None)
            assert answers[-1] == [image]
            if count == 1:
                one_copy = worker.staged_bytes
        assert one_copy == encoder_output(image).numel() * encoder_output(image).element_size()
        assert worker.staged_bytes == one_copy
    finally:
        engine.shutdown()


def test_a_claim_of_an_ended_request_is_withdrawn_at_once(model_config, extra, disk_dir):
    free, held = image_hash("claimed-then-aborted.png"), image_hash("held-by-the-dead.png")
    waiting = {**extra, "claim_wait_s": 600.0}  # a bound no test reaches
    first = Engine(make_vllm_config(model_config, "ec_both", waiting))
    second = Engine(make_vllm_config(model_config, "ec_both", waiting))
    try:
        first.step()  # the scheduler learns the encoder weights
        claimed_by_a_dead_process(first, held, disk_dir)
        request = first.add_request([free, held])
        first.step()  # claims ``free``; waits for ``held``
        assert first.connector.scheduler.items.state(free) is S.CLAIMED
        first.scheduler.finish_requests(request, RequestStatus.FINISHED_ABORTED)
        second.step()
        wanted = second.add_request([free])
        second.step()
        assert second.encoded == [free]  # at once, not after claim_wait_s
        second.run_until_finished([wanted])
        assert bit_equal(second.gathered[free], encoder_output(free))
        assert second.ec_stats.get("scheduler_claims_lost", 0) == 0
        assert first.encoded == []
    finally:
        first.shutdown()
        second.shutdown()


def test_the_records_of_claims_waited_on_by_ended_requests_leave_at_their_deadline(
    model_config, extra, disk_dir
):
    """Requests waiting for another instance's encodes end (the client went away):
    their items leave the table once ``claim_wait_s`` passes, not never."""
    images = [image_hash(f"claimed-elsewhere-{i}.png") for i in range(4)]
    engine = Engine(make_vllm_config(model_config, "ec_both", {**extra, "claim_wait_s": RETRY_S}))
    scheduler = engine.connector.scheduler
    try:
        engine.step()  # the scheduler learns the encoder weights
        for image in images:
            claimed_by_a_dead_process(engine, image, disk_dir)
        requests = [engine.add_request([image]) for image in images]
        engine.step()
        assert {scheduler.items.state(image) for image in images} == {S.AWAITING}
        for request in requests:
            engine.scheduler.finish_requests(request, RequestStatus.FINISHED_ABORTED)
        time.sleep(RETRY_S * 1.5)
        engine.run_until_finished([engine.add_request([])])  # steps past the deadline
        assert len(scheduler.items) == 0
    finally:
        engine.shutdown()


class _SlowRemote:
    """A remote catalog that answers "absent" a moment after each question."""

    last_error = None

    def lookup_many(self, names: list[str]) -> list[bool]:
        time.sleep(0.05)
        return [False] * len(names)

    def close(self) -> None:
        pass


def test_the_record_of_a_lookup_whose_request_ended_leaves_at_its_answer():
    index = TierIndex(
        EncoderIdentity(model="m"),
        disk_dir=None,
        open_catalog=_SlowRemote,
        negative_ttl=5.0,
        purge_check_s=3600,
    )
    scheduler = TierScheduler(
        ConnectorSettings(
            idle_stage_wait_s=0.0, busy_stage_wait_s=0.0, remote_lookup_timeout_s=60.0
        ),
        index,
        is_producer=True,
        is_consumer=True,
        tp_size=1,
        deliver_on_idle=True,
    )
    image = image_hash("looked-up-for-nobody.png")
    try:
        request = lone_request(image)
        assert not scheduler.ensure_cache_available(request, 0)
        assert scheduler.items.state(image) is S.LOOKING_UP
        scheduler.request_finished(request.request_id)  # the client went away
        other = image_hash("asked-about-next.png")  # the next step's question
        _until(lambda: scheduler.items.get(image) is None, lambda: scheduler.has_cache_item(other))
        assert index.lookup(image) is None  # the answer is kept for the next request
    finally:
        index.close()


@pytest.mark.parametrize("role", ["ec_both", "ec_consumer"])
def test_a_request_needing_more_items_than_the_bounds_loads_what_fits_and_computes_the_rest(
    model_config, extra, role
):
    """Its staged items keep their room until it is scheduled with all of them:
    the one beyond ``max_inflight_items`` would wait for room only the request
    frees (ec_both: ``stage_timeout_s``; ec_consumer: the request failed)."""
    images = [image_hash(f"one-of-three-{i}.png") for i in range(3)]
    writer = Engine(make_vllm_config(model_config, "ec_both", extra))
    try:
        writer.run_until_finished([writer.add_request([image]) for image in images])
        writer.flush()
    finally:
        writer.shutdown()
    settings = {**extra, "max_inflight_items": 2, "stage_timeout_s": 600.0}
    engine = Engine(make_vllm_config(model_config, role, settings))
    try:
        engine.step()  # the scheduler learns the encoder weights
        request = engine.add_request(images)
        engine.run_until_finished([request], max_steps=200)
        assert engine.finished[request] != "error"
        assert len(engine.encoded) == 1 and engine.ec_stats["loads"] == 2
        for image in images:
            assert bit_equal(engine.gathered[image], encoder_output(image))
    finally:
        engine.shutdown()
