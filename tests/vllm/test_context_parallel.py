"""Prefill context parallelism (PCP): every worker that runs the EC hooks is a rank.

With PCP > 1 every first-pipeline-stage worker has an encoder cache, and each
PCP slice has its own tensor-parallel group: two workers of one engine share
tensor-parallel rank 0. The connector counts TP x PCP ranks (``rank = pcp_rank
x tp_size + tp_rank``): each listens on a stage socket of its own, an item is
READY only once every one of them staged it (so a load never reads the tier
inside a step, nor finds the entry gone), and one of them writes each item to
a shared tier. Driven through vLLM's real Scheduler with PCP=2, TP=1.
"""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest
from vllm.distributed import parallel_state

from lmcache_ec.integration.vllm.connector import ParallelPosition, _parallel_position
from lmcache_ec.integration.vllm.items import HELD_STATES, ItemState
from tests.conftest import bit_equal

from .harness import (
    Engine,
    encoder_output,
    image_hash,
    make_vllm_config,
    orders_in_step_metadata,
    step_until,
    stored_by_a_producer,
)

PCP = 2
S = ItemState


@pytest.fixture
def pcp_config(model_config, extra, monkeypatch):
    """A PCP=2 config of ``role``; the V2 runner (vLLM's PCP needs it) once built."""

    def make(role: str):
        config = make_vllm_config(model_config, role, extra)
        config.parallel_config.prefill_context_parallel_size = PCP
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
        return config

    return make


def _stager_held(engine: Engine, rank: int) -> threading.Event:
    """Holds ``rank``'s staging reads (its stager thread only, never a step's own
    read) until the returned gate opens."""
    cache = engine.workers[rank].worker.cache
    gate, read = threading.Event(), cache.get_many

    def after_gate(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            gate.wait(60)
        return read(*args, **kwargs)

    cache.get_many = after_gate
    return gate


def _one_rank_staged(engine: Engine, identifier: str) -> bool:
    item = engine.connector.scheduler.items.get(identifier)
    return item is not None and (item.ranks > 0 or item.state in HELD_STATES)


def _entries(disk_dir) -> list[str]:
    return sorted(name for name in os.listdir(disk_dir) if name.endswith(".pt"))


def _groups(monkeypatch, *, tp: tuple[int, int], pcp: tuple[int, int] | None) -> None:
    """vLLM's process groups as a worker of that position holds them."""

    def group(rank: int, size: int) -> SimpleNamespace:  # a GroupCoordinator's fields
        return SimpleNamespace(rank_in_group=rank, world_size=size)

    monkeypatch.setattr(parallel_state, "_TP", group(*tp))
    monkeypatch.setattr(parallel_state, "_PP", group(0, 1))
    if pcp is None:  # a vLLM without prefill context parallelism
        monkeypatch.delattr(parallel_state, "get_pcp_group")
    else:
        monkeypatch.setattr(parallel_state, "_PCP", group(*pcp))


def test_a_worker_is_numbered_over_the_tensor_parallel_ranks_of_every_pcp_slice(monkeypatch):
    _groups(monkeypatch, tp=(1, 2), pcp=(1, 2))
    position = _parallel_position()
    assert position == ParallelPosition(1, 2, 0, 1, 2)
    assert (position.rank, position.ranks) == (3, 4)


def test_a_vllm_without_context_parallelism_counts_tensor_parallel_ranks(monkeypatch):
    _groups(monkeypatch, tp=(1, 2), pcp=None)
    position = _parallel_position()
    assert (position.rank, position.ranks) == (1, 2)


def test_every_context_parallel_worker_listens_on_a_stage_socket_of_its_own(pcp_config):
    engine = Engine(pcp_config("ec_consumer"), pcp_size=PCP)
    try:
        assert all(worker._listener is not None for worker in engine.workers)
        channel = engine.connector.scheduler.channel
        assert len(set(channel.paths)) == PCP
        engine.step()
        assert channel.connected  # the scheduler reached every worker
    finally:
        engine.shutdown()


@pytest.mark.parametrize("path", ["stage_channel", "step_metadata"])
def test_an_item_is_ready_only_once_both_context_parallel_workers_staged_it(
    model_config, extra, pcp_config, path
):
    image = image_hash(f"pcp-ready-{path}.png")
    stored_by_a_producer(model_config, extra, [image])
    engine = Engine(pcp_config("ec_consumer"), pcp_size=PCP)
    gate = _stager_held(engine, 1)
    try:
        if path == "step_metadata":
            orders_in_step_metadata(engine)
        request = engine.add_request([image])
        step_until(engine, lambda: _one_rank_staged(engine, image))
        item = engine.connector.scheduler.items.get(image)
        assert (item.state, item.ranks) == (S.STAGING, 1)  # the second one still reads
        gate.set()
        engine.run_until_finished([request])
        assert engine.encoded == []
        for encoder_cache in engine.encoder_caches:  # both workers got the tensor
            assert bit_equal(encoder_cache[image], encoder_output(image))
        assert engine.ec_stats["loads"] == PCP
        assert engine.ec_stats.get("load_direct_reads", 0) == 0  # none read in a step
    finally:
        gate.set()
        engine.shutdown()


def test_an_entry_gone_after_one_worker_staged_it_is_computed_not_a_crash(
    model_config, extra, disk_dir, pcp_config
):
    """The second worker's read misses: the item is given up and computed, never
    promised to a worker that holds no copy ("Encoder cache miss")."""
    image = image_hash("pcp-evicted.png")
    stored_by_a_producer(model_config, extra, [image])
    engine = Engine(pcp_config("ec_both"), pcp_size=PCP)
    gate = _stager_held(engine, 1)
    try:
        request = engine.add_request([image])
        step_until(engine, lambda: _one_rank_staged(engine, image))
        for name in _entries(disk_dir):  # evicted, purged... before the second read
            os.unlink(disk_dir / name)
        gate.set()
        engine.run_until_finished([request])
        assert engine.ec_stats.get("load_direct_reads", 0) == 0
        assert engine.encoded == [image]
        assert bit_equal(engine.gathered[image], encoder_output(image))
    finally:
        gate.set()
        engine.shutdown()


def test_one_context_parallel_worker_writes_each_item(disk_dir, pcp_config):
    engine = Engine(pcp_config("ec_both"), pcp_size=PCP)
    images = [image_hash(f"pcp-write-{n}.png") for n in range(8)]
    caches = [worker.worker.cache for worker in engine.workers]
    try:
        engine.run_until_finished([engine.add_request([image]) for image in images])
        engine.flush()
    finally:
        engine.shutdown()
    puts = [cache.stats.puts for cache in caches]
    assert sum(puts) == len(images) and all(puts)  # each once, spread over workers
    assert len(_entries(disk_dir)) == len(images)
