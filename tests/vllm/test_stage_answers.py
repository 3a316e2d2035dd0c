"""A stage answer moves only the order it answers; the channel never costs a step much.

- The answer to a stage order the scheduler gave up (its read was slow) is never
  taken for the next order of the same item: the item is promised only once the
  read of that order staged it, on every rank, so its load never misses, over
  the stage channel (one rank or two) and in step metadata alike.
- A read in flight across a weights session that leaves the encoder unchanged
  (w1, unknown, w1 again) answers nothing, and leaves the new order of the same
  item to stage it.
- A stage channel that breaks fails no request and holds no item off the
  tiers: its stagings are computed (or fetched again), as when nothing failed.
- ``stage_timeout_s`` counts from queueing: a prefetch keeps its deadline when
  it leaves the queue.
- A worker report with a counter below zero (which Prometheus refuses, inside
  vLLM's output handler) is a bad frame: the channel breaks, the step goes on.
- A peer that floods the channel gets a bounded share of each ``receive``; the
  rest comes with the next calls, none of it lost.

Real scheduler, worker, stage channel and caches; a tier read the test holds
stands for a slow tier.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from lmcache_ec.integration.vllm.channel import StageListener
from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.index import TierIndex
from lmcache_ec.integration.vllm.items import ItemState
from lmcache_ec.integration.vllm.scheduler import TierScheduler
from lmcache_ec.integration.vllm.stage_client import StageClient
from lmcache_ec.integration.vllm.stage_messages import (
    TO_SCHEDULER,
    BadFrame,
    StageAnswer,
    WeightsAnnouncement,
    WorkerReport,
    decode,
    encode,
)
from lmcache_ec.integration.vllm.worker import TierWorker
from lmcache_ec.key import EncoderIdentity
from tests.conftest import bit_equal

from .harness import encoder_output, image_hash, lone_request

S = ItemState
WEIGHTS = "w1"
TIMEOUT_S = 0.3  # stage_timeout_s where a test waits a staging out


def _until(condition, poll=lambda: None, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        poll()
        time.sleep(0.002)


def _request(identifier: str, request_id: str):
    request = lone_request(identifier)
    request.request_id = request_id
    return request


def _step(tokens: int = 0) -> SimpleNamespace:
    """What the scheduler's build_connector_meta reads of vLLM's output."""
    return SimpleNamespace(
        total_num_scheduled_tokens=tokens, scheduled_new_reqs=[], free_encoder_mm_hashes=[]
    )


class SlowTier:
    """A real ECCache whose reads wait, one by one, for the test to let them end."""

    def __init__(self, cache) -> None:
        self._cache = cache
        self._held: collections.deque[threading.Event] = collections.deque()
        self.reads = 0

    def __getattr__(self, name: str):
        return getattr(self._cache, name)

    def hold_next_read(self) -> threading.Event:
        """The next read waits until the returned event is set."""
        gate = threading.Event()
        self._held.append(gate)
        return gate

    def get_many(self, identifiers, device, pin_memory=False):
        gate = self._held.popleft() if self._held else None
        self.reads += 1
        if gate is not None:
            assert gate.wait(10)
        return self._cache.get_many(identifiers, device, pin_memory=pin_memory)


class Instance:
    """A scheduler and ``tp_size`` workers with their caches, wired as the
    connector wires them (over a stage channel unless ``channel`` is False)."""

    def __init__(self, tmp_path, make_cache, *, tp_size=1, channel=True, **settings) -> None:
        options = {"idle_stage_wait_s": 0.0, "busy_stage_wait_s": 0.0, **settings}
        self.settings = ConnectorSettings(**options)
        self.tiers: list[SlowTier] = []
        self.workers: list[TierWorker] = []
        self.listeners: list[StageListener] = []
        paths = [str(tmp_path / f"rank{rank}.sock") for rank in range(tp_size)]
        for rank, path in enumerate(paths):
            cache = make_cache({"local_cpu": True, "max_local_cpu_size": 0.0625}, weights=WEIGHTS)
            self.tiers.append(SlowTier(cache))
            worker = TierWorker(
                self.tiers[-1],
                self.settings,
                persistable=self.settings.persistable,
                is_producer=False,
                is_consumer=True,
                tp_rank=rank,
                tp_size=tp_size,
            )
            self.workers.append(worker)
            if channel:
                self.listeners.append(
                    StageListener(
                        path,
                        lambda ids, weights, link, rows, worker=worker: worker.stage(
                            ids, weights, link, rows=rows
                        ),
                        lambda worker=worker: WeightsAnnouncement(worker.weights),
                        on_release=lambda ids, worker=worker: worker.release(ids),
                    )
                )
        self.index = TierIndex(
            EncoderIdentity(model="m", weights=WEIGHTS),
            disk_dir=None,
            open_catalog=None,
            negative_ttl=5.0,
        )
        self.scheduler = TierScheduler(
            self.settings,
            self.index,
            is_producer=False,
            is_consumer=True,
            tp_size=tp_size,
            deliver_on_idle=True,
            channel=StageClient(paths) if channel else None,
            weights_from_workers=channel,  # else the scheduler's own (as the workers')
        )
        self.received: list = []  # what the scheduler read on the channel
        if channel:
            receive = self.scheduler.channel.receive

            def recording(timeout: float = 0.0):
                messages = receive(timeout)
                self.received.extend(messages)
                return messages

            self.scheduler.channel.receive = recording
            self.scheduler.build_connector_meta(_step())  # connects; the workers announce
            _until(lambda: self.scheduler.weights == WEIGHTS, self.scheduler.take_stats)

    def store(self, identifier: str) -> None:
        """Every rank's tier holds ``identifier``, and the scheduler knows it."""
        for tier in self.tiers:
            assert tier.put(identifier, encoder_output(identifier))
        self.index.note_present(identifier, "worker")

    def poll(self) -> None:
        self.scheduler.link.poll(0.0)

    def report(self) -> None:
        """Step metadata: each worker's report, aggregated as vLLM does, applied."""
        metas = [meta for worker in self.workers if (meta := worker.build_worker_meta())]
        if metas:
            merged = metas[0]
            for meta in metas[1:]:
                merged = merged.aggregate(meta)
            self.scheduler.update_connector_output(merged)

    def answered(self, identifier: str) -> int:
        """Stage answers that said ``identifier`` staged, read by the scheduler."""
        return sum(
            identifier in message.staged
            for message in self.received
            if isinstance(message, StageAnswer)
        )

    def load(self, request) -> dict[str, torch.Tensor]:
        """Schedule ``request`` (promised) and run each rank's load of the step."""
        assert self.scheduler.ensure_cache_available(request, 0)
        assert self.scheduler.has_cache_item(request.mm_features[0].identifier)
        self.scheduler.update_state_after_alloc(request, 0)
        meta = self.scheduler.build_connector_meta(_step(tokens=1))
        caches: list[dict[str, torch.Tensor]] = []
        for worker in self.workers:
            caches.append({})
            worker.start_load_caches(caches[-1], meta)
            stats = (worker.build_worker_meta() or SimpleNamespace(stats={})).stats
            assert "load_direct_reads" not in stats  # the staged copy was there
        return caches[0]

    def close(self) -> None:
        if self.scheduler.channel is not None:
            self.scheduler.channel.close()
        for listener in self.listeners:
            listener.close()
        for worker in self.workers:
            worker.close()
        self.index.close()


@pytest.fixture
def instance(tmp_path, make_cache):
    built: list[Instance] = []

    def build(**options) -> Instance:
        built.append(Instance(tmp_path, make_cache, **options))
        return built[-1]

    yield build
    for each in built:
        each.close()


def _report_staging(worker: TierWorker, image: str):
    """The worker's first step report that says ``image`` staged."""
    reports = []

    def report() -> None:
        meta = worker.build_worker_meta()
        if meta is not None and image in meta.staged:
            reports.append(meta)

    _until(lambda: reports, report)
    return reports[0]


def _give_up_a_slow_staging(instance: Instance, image: str, slow_ranks) -> list[threading.Event]:
    """Order ``image`` for request r1; the reads of ``slow_ranks`` hang past
    stage_timeout_s and r1's staging is given up (r1 fails: a consumer).
    Returns the gates of those reads, still closed."""
    scheduler = instance.scheduler
    held = [instance.tiers[rank].hold_next_read() for rank in slow_ranks]
    first = _request(image, "r1")
    assert not scheduler.ensure_cache_available(first, 0)
    assert scheduler.items.state(image) is S.STAGING
    scheduler.build_connector_meta(_step())  # the order leaves
    _until(lambda: all(instance.tiers[rank].reads == 1 for rank in slow_ranks))
    fast_ranks = len(instance.tiers) - len(slow_ranks)
    _until(lambda: instance.answered(image) == fast_ranks, instance.poll)
    time.sleep(TIMEOUT_S * 1.5)
    scheduler.build_connector_meta(_step())  # a step past the deadline
    assert not scheduler.ensure_cache_available(first, 0)
    assert scheduler.take_unavailable_requests() == {"r1"}
    assert scheduler.items.state(image) is S.UNKNOWN
    return held


@pytest.mark.parametrize("tp_size", [1, 2])
def test_the_answer_to_an_order_given_up_is_not_taken_for_the_next_order(instance, tp_size):
    """One rank: order A's late answer arrives once order B of the same image is
    out (the worker dropped A's copy and still reads B). Two ranks: rank 1's
    answer to A and rank 0's to B would add up to both ranks."""
    node = instance(tp_size=tp_size, stage_timeout_s=TIMEOUT_S)
    scheduler, image = node.scheduler, image_hash("retried.png")
    node.store(image)
    slow = tp_size - 1  # the rank whose reads hang
    (order_a,) = _give_up_a_slow_staging(node, image, [slow])
    node.received.clear()  # on two ranks, rank 0's answer to A came before
    order_b = node.tiers[slow].hold_next_read()
    order_a.set()
    _until(lambda: node.workers[slow].staged_bytes > 0)  # A staged: its answer is out
    node.index.note_present(image, "worker")  # given up, looked up again: still there
    second = _request(image, "r2")
    assert not scheduler.ensure_cache_available(second, 0)  # order B, in the same step
    assert scheduler.items.state(image) is S.STAGING
    # A's answer, and on two ranks rank 0's answer to B, reach the scheduler.
    _until(lambda: node.answered(image) == tp_size, node.poll)
    assert scheduler.items.state(image) is S.STAGING  # B is still being read
    scheduler.build_connector_meta(_step())
    _until(lambda: node.workers[slow].staged_bytes == 0)  # A's copy released
    order_b.set()
    _until(lambda: scheduler.items.state(image) is S.READY, node.poll)
    loaded = node.load(second)
    assert bit_equal(loaded[image], encoder_output(image))


def test_a_late_step_report_is_not_taken_for_the_next_order(instance):
    """The same in step metadata (no stage channel): the report of order A comes
    back after the step that released it and ordered B (asynchronous scheduling)."""
    node = instance(channel=False, stage_timeout_s=TIMEOUT_S)
    scheduler, worker, image = node.scheduler, node.workers[0], image_hash("reported.png")
    node.store(image)
    order_a = node.tiers[0].hold_next_read()
    first = _request(image, "r1")
    assert not scheduler.ensure_cache_available(first, 0)
    worker.start_load_caches({}, scheduler.build_connector_meta(_step(tokens=1)))
    _until(lambda: node.tiers[0].reads == 1)
    time.sleep(TIMEOUT_S * 1.5)
    scheduler.build_connector_meta(_step(tokens=1))
    assert not scheduler.ensure_cache_available(first, 0)  # given up: r1 fails
    order_b = node.tiers[0].hold_next_read()
    order_a.set()
    late = _report_staging(worker, image)  # A's answer
    node.index.note_present(image, "worker")  # given up, looked up again: still there
    second = _request(image, "r2")
    assert not scheduler.ensure_cache_available(second, 0)
    meta = scheduler.build_connector_meta(_step(tokens=1))  # releases A, orders B
    assert meta.release == [image] and meta.stage == [image]
    scheduler.update_connector_output(late)
    assert scheduler.items.state(image) is S.STAGING
    worker.start_load_caches({}, meta)
    order_b.set()
    _until(lambda: scheduler.items.state(image) is S.READY, node.report)
    assert bit_equal(node.load(second)[image], encoder_output(image))


def _ordered_with_its_read_held(node, image: str):
    """``image`` stored and ordered for a request ``r1``, its read held in the
    tier: the event that lets the read go on, and the request."""
    node.store(image)
    held = node.tiers[0].hold_next_read()
    request = _request(image, "r1")
    assert not node.scheduler.ensure_cache_available(request, 0)
    node.scheduler.build_connector_meta(_step())
    _until(lambda: node.tiers[0].reads == 1)
    return held, request


def test_a_read_across_an_unchanged_weights_session_leaves_the_new_order_to_stage(instance):
    """w1, unknown, w1 again while order A's read is in flight: the read answers
    nothing, and order B of the same image (under w1) stages it."""
    node = instance(stage_timeout_s=60.0)
    scheduler, worker, image = node.scheduler, node.workers[0], image_hash("unchanged.png")
    order_a, _ = _ordered_with_its_read_held(node, image)

    def weights_changed(version):  # what the connector does on a weights change
        assert worker.set_weights(version)
        node.listeners[0].broadcast(WeightsAnnouncement(version))
        _until(lambda: scheduler.weights == version, node.poll)

    weights_changed(None)
    assert scheduler.items.state(image) is S.UNKNOWN  # given up: nothing failed
    weights_changed(WEIGHTS)
    scheduler.build_connector_meta(_step())
    node.index.note_present(image, "worker")  # given up, looked up again: still there
    second = _request(image, "r2")
    assert not scheduler.ensure_cache_available(second, 0)  # order B
    scheduler.build_connector_meta(_step())
    _until(lambda: worker._stage_queue.qsize() > 0)  # B reached the worker before A's read ends
    order_a.set()
    _until(lambda: scheduler.items.state(image) is S.READY, node.poll)
    assert not scheduler.take_unavailable_requests()
    assert bit_equal(node.load(second)[image], encoder_output(image))


def test_a_broken_channel_fails_no_request_and_holds_no_item_off_the_tiers(instance):
    node = instance(stage_timeout_s=60.0)
    scheduler, image = node.scheduler, image_hash("channel-broke.png")
    read, first = _ordered_with_its_read_held(node, image)
    node.listeners[0].close()  # the worker's end goes away
    _until(lambda: not scheduler.channel.connected, node.poll)
    assert not scheduler.take_unavailable_requests()
    assert scheduler.items.retry_at(image) == 0  # fetched again at once
    node.index.note_present(image, "worker")  # given up, looked up again: still there
    scheduler.build_connector_meta(_step())
    assert not scheduler.ensure_cache_available(first, 0)  # waits for a new order...
    assert scheduler.items.state(image) is S.STAGING  # ... in step metadata
    assert not scheduler.take_unavailable_requests()
    read.set()


def test_the_stage_timeout_counts_from_queueing(instance):
    """One prefetch in flight at most: the second image waits in the queue, and
    keeps the deadline it was queued with once it leaves."""
    node = instance(stage_timeout_s=60.0, max_inflight_items=1)
    scheduler = node.scheduler
    missing, queued = image_hash("not-in-the-tier.png"), image_hash("queued.png")
    node.store(queued)
    node.index.note_present(missing, "worker")  # the worker's read finds nothing
    assert not scheduler.ensure_cache_available(_request(missing, "r1"), 0)
    assert not scheduler.ensure_cache_available(_request(queued, "r2"), 0)
    assert scheduler.items.state(queued) is S.QUEUED
    deadline = scheduler.items.get(queued).deadline
    # The read fails, the first image is given up, its room goes to the second.
    _until(
        lambda: scheduler.items.state(queued) is S.STAGING,
        lambda: scheduler.build_connector_meta(_step()),
    )
    assert scheduler.items.get(queued).deadline == deadline


def test_a_counter_below_zero_is_a_bad_frame_and_a_feature_back_on_is_not():
    def report(stats):
        return encode(WorkerReport((), (), (), stats, WEIGHTS))[4:]

    with pytest.raises(BadFrame):
        decode(report({"misses": -1, "loads": 1}), TO_SCHEDULER)
    back_on = {"feature_off:stage_channel:no_private_dir": -1.0}
    assert decode(report(back_on), TO_SCHEDULER).stats == back_on


@contextlib.contextmanager
def _scheduler_and_peer(tmp_path) -> Iterator[tuple[StageClient, socket.socket]]:
    """A scheduler's stage client connected to a peer the test plays."""
    path = str(tmp_path / "peer.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    client = StageClient([path])
    try:
        assert client.connect()
        peer, _ = server.accept()
        with peer:
            yield client, peer
    finally:
        client.close()
        server.close()


def test_a_report_with_a_counter_below_zero_breaks_the_channel_not_the_step(tmp_path):
    with _scheduler_and_peer(tmp_path) as (client, peer):
        peer.sendall(encode(WorkerReport((), (), (), {"misses": -1}, WEIGHTS)))
        messages: list = []
        _until(lambda: not client.connected, lambda: messages.extend(client.receive(0.01)))
        assert messages == []
        assert client.take_counts() == {"channel_breaks": 1, "channel_bad_frames": 1}


def test_a_flood_is_read_a_bounded_share_per_receive_and_none_of_it_lost(tmp_path):
    frames = [StageAnswer((), (f"{n:064x}",), WEIGHTS) for n in range(1000)]
    with _scheduler_and_peer(tmp_path) as (client, peer):
        peer.sendall(b"".join(encode(frame) for frame in frames))  # ~110 KB, all there now
        received = client.receive(0.0)
        assert 0 < len(received) <= 256  # a share, not all of it
        _until(lambda: len(received) >= len(frames), lambda: received.extend(client.receive(0)))
        assert received == frames  # in order, nothing lost, nothing twice
        assert client.connected
