"""Roles, tensor-parallel writes and a tier failing under a load, via the real Scheduler."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.conftest import bit_equal

from .harness import Engine, encoder_output, image_hash, make_vllm_config


@pytest.fixture
def v2(monkeypatch):
    """Build configs first (VllmConfig refuses V2 without Triton), then flip the flag."""

    def flip() -> None:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")

    return flip


def _serve(engine: Engine, images: list[str]) -> None:
    try:
        requests = [engine.add_request([image]) for image in images]
        engine.run_until_finished(requests)
        engine.flush()
    finally:
        engine.shutdown()


def _entries(disk_dir) -> list[str]:
    return sorted(name for name in os.listdir(disk_dir) if name.endswith(".pt"))


def test_producer_saves_and_skips_what_is_stored(model_config, extra, disk_dir, v2):
    configs = [make_vllm_config(model_config, "ec_producer", extra) for _ in range(2)]
    v2()
    image = image_hash("dog.png")
    first = Engine(configs[0])
    _serve(first, [image])
    assert first.encoded == [image] and len(_entries(disk_dir)) == 1
    second = Engine(configs[1])
    _serve(second, [image])
    assert second.encoded == []  # encode-only: nothing to do for a stored item
    assert second.connector.scheduler._loads == {}  # and nothing is ever loaded


def test_an_output_computed_again_after_it_left_the_tiers_is_saved_again(
    model_config, extra, disk_dir
):
    """vLLM saves only what it computed: an item this worker saved before and
    that the tiers no longer hold (evicted, purged) is stored again."""
    engine = Engine(make_vllm_config(model_config, "ec_both", extra))
    image = image_hash("popular.png")
    try:
        engine.run_until_finished([engine.add_request([image])])
        engine.flush()
        cache = engine.workers[0].worker.cache
        assert cache.remove(image) and _entries(disk_dir) == []  # evicted, say
        for encoder_cache in engine.encoder_caches:
            encoder_cache.clear()  # and gone from vLLM's encoder cache too
        engine.scheduler.reset_encoder_cache()
        engine.run_until_finished([engine.add_request([image])])
        engine.flush()
        assert engine.encoded == [image, image]
        assert len(_entries(disk_dir)) == 1 and cache.contains(image) is not None
    finally:
        engine.shutdown()


def test_consumer_loads_but_never_saves(model_config, extra, disk_dir, v2):
    configs = [make_vllm_config(model_config, "ec_consumer", extra) for _ in range(2)]
    configs.append(make_vllm_config(model_config, "ec_producer", extra))
    v2()
    stored, fresh = image_hash("stored.png"), image_hash("fresh.png")
    _serve(Engine(configs[2]), [stored])
    assert len(_entries(disk_dir)) == 1
    consumer = Engine(configs[0])
    _serve(consumer, [stored, fresh])
    assert consumer.encoded == [fresh]  # the stored one was loaded
    assert bit_equal(consumer.gathered[stored], encoder_output(stored))
    assert len(_entries(disk_dir)) == 1  # the fresh one was not written


def test_one_tensor_parallel_rank_writes_each_item(model_config, extra, disk_dir, v2):
    configs = [make_vllm_config(model_config, "ec_both", extra, tp_size=2) for _ in range(2)]
    v2()
    images = [image_hash(f"tp-{n}.png") for n in range(8)]
    first = Engine(configs[0], tp_size=2)
    caches = [worker.worker.cache for worker in first.workers]
    _serve(first, images)
    puts = [cache.stats.puts for cache in caches]
    assert sum(puts) == len(images) and all(puts)  # each once, spread over ranks
    assert len(_entries(disk_dir)) == len(images)

    second = Engine(configs[1], tp_size=2)
    try:
        request = second.add_request([images[0]])
        second.run_until_finished([request])
        assert second.encoded == []
        for rank_cache in second.encoder_caches:  # both ranks got the tensor
            assert bit_equal(rank_cache[images[0]], encoder_output(images[0]))
    finally:
        second.shutdown()


def test_one_tensor_parallel_rank_writes_each_item_to_the_node_tier(model_config, v2):
    """The node tier is shared by the ranks of a node, as the disk tier is: one
    rank writes each item (``ECConfig.shared_tier``), not every rank a copy."""
    node_base = tempfile.mkdtemp(prefix="ec-roles-node-", dir="/dev/shm")
    tier = {"max_local_cpu_size": 0.01, "node_tier": True, "node_dir": node_base}
    config = make_vllm_config(model_config, "ec_both", {"lmcache_config": tier}, tp_size=2)
    v2()
    images = [image_hash(f"tp-node-{n}.png") for n in range(8)]
    try:
        engine = Engine(config, tp_size=2)
        caches = [worker.worker.cache for worker in engine.workers]
        _serve(engine, images)
        puts = [cache.stats.puts for cache in caches]
        assert sum(puts) == len(images) and all(puts)  # each once, spread over ranks
    finally:
        shutil.rmtree(node_base, ignore_errors=True)


def test_failing_tier_during_load_falls_back_to_the_encoder(model_config, extra, disk_dir, v2):
    configs = [make_vllm_config(model_config, "ec_both", extra) for _ in range(2)]
    v2()
    image = image_hash("torn.png")
    _serve(Engine(configs[0]), [image])
    [entry] = _entries(disk_dir)
    path = os.path.join(disk_dir, entry)
    with open(path, "r+b") as stream:  # the disk tier now returns a torn frame
        stream.seek(os.path.getsize(path) - 8)
        stream.write(b"\xff" * 8)

    second = Engine(configs[1])
    try:
        request = second.add_request([image])
        second.run_until_finished([request])  # not stuck
        assert second.finished[request] == "length"  # finished normally, not an error
        assert second.encoded == [image]  # the encoder ran instead
        assert bit_equal(second.gathered[image], encoder_output(image))
        assert second.ec_stats["scheduler_stage_given_up"] == 1
        assert second.ec_stats["integrity_failures"] == 1
    finally:
        second.shutdown()
