"""A hit's way through the worker: the per-request timeline (``ec.timeline_path``)
through vLLM's real Scheduler, when a staged disk hit is promoted into the CPU
tier (right after its answer), and the interpreter's switch interval a
loading worker runs with (so its staging threads are not starved of the GIL
by vLLM's spinning worker loop)."""

from __future__ import annotations

import json
import sys
import time

import pytest
import torch

from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.switch_interval import LOADING_SWITCH_INTERVAL_S
from lmcache_ec.integration.vllm.worker import TierWorker

from .harness import Engine, image_hash, make_vllm_config

ORDER = ("lookup", "stage_sent", "staged", "scheduled")


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_lone_hit_records_its_way_in_order(model_config, extra, runner, monkeypatch, tmp_path):
    """An idle engine (V1's hard case: no tokens, no hooks, until the hit is staged):
    the hit is scheduled with its load in the step it arrived in, and its
    timeline has every event, in order, from both sides."""
    image = image_hash("timeline.png")
    path = tmp_path / "timeline.jsonl"
    timed = {
        **extra,
        # The step waits this long for the staging (0.5 s by default): a loaded
        # test machine must not turn this test about order into one about time.
        "idle_stage_wait_s": 5.0,
        "lmcache_config": dict(extra["lmcache_config"], timeline_path=str(path)),
    }
    configs = [make_vllm_config(model_config, "ec_both", e) for e in (extra, timed)]
    # VllmConfig refuses V2 without Triton; the connector only reads the flag.
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if runner == "v2" else "0")
    first = Engine(configs[0], runner=runner)
    try:
        first.run_until_finished([first.add_request([image])])
        first.flush()
    finally:
        first.shutdown()
    second = Engine(configs[1], runner=runner)
    try:
        request = second.add_request([image])
        steps = second.run_until_finished([request])
        assert second.encoded == []
        assert steps == 1  # loaded in the step it arrived in
    finally:
        second.shutdown()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    scheduler = [r for r in records if "request" in r]
    assert [r["request"] for r in scheduler] == [request]
    events = scheduler[0]["items"][image]
    assert list(events) == list(ORDER)  # recorded in the order they happen
    times = [scheduler[0]["seen"], *(events[name] for name in ORDER)]
    assert times == sorted(times)
    worker = {name: r[name] for r in records if r.get("item") == image for name in r}
    assert events["stage_sent"] <= worker["read"] <= events["staged"]
    assert events["scheduled"] <= worker["loaded"]


def test_a_staged_disk_hit_is_promoted_right_after_its_answer(tmp_path, make_cache):
    """Promoting a disk hit into the CPU tier is work for the interpreter; left to
    the cache's own thread it lands in the step that loads the hit. The worker
    does it right after answering the stage order instead."""
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": str(tmp_path / "disk"),
        "max_local_disk_size": 0.05,
    }
    identifiers = [image_hash(f"promote-{n}.png") for n in range(2)]
    with make_cache(config, model="org/promote") as writer:
        for n, identifier in enumerate(identifiers):
            assert writer.put(identifier, torch.full((4, 8), float(n)))
        assert writer.flush()
    cache = make_cache(config, model="org/promote")  # fresh: disk only
    worker = TierWorker(
        cache,
        ConnectorSettings(),
        persistable=lambda identifier: True,
        is_producer=False,
        is_consumer=True,
    )
    try:
        worker.stage(identifiers, None, None)
        staged, stats = set(), {}
        deadline = time.monotonic() + 10
        while "promoted_after_staging" not in stats and time.monotonic() < deadline:
            meta = worker.build_worker_meta()
            if meta is not None:
                staged |= set(meta.staged)
                for name, value in meta.stats.items():
                    stats[name] = stats.get(name, 0) + value
            time.sleep(0.002)
        assert staged == set(identifiers)
        assert stats.get("promoted_after_staging") == len(identifiers)
        assert stats.get("hits_disk") == len(identifiers)
        assert {cache.contains(identifier) for identifier in identifiers} == {"cpu"}
    finally:
        worker.close()


@pytest.mark.parametrize("role", ["ec_both", "ec_producer"])
def test_a_loading_instance_switches_threads_often_and_restores_it(model_config, extra, role):
    """Scheduler and worker both: their threads wake up inside vLLM's spinning waits."""
    before = sys.getswitchinterval()
    assert before > LOADING_SWITCH_INTERVAL_S  # Python's default, 5 ms
    engine = Engine(make_vllm_config(model_config, role, extra))
    try:
        # An encode-only instance loads nothing: it leaves the interpreter alone.
        expected = LOADING_SWITCH_INTERVAL_S if role == "ec_both" else before
        assert sys.getswitchinterval() == pytest.approx(expected)
    finally:
        engine.shutdown()
    assert sys.getswitchinterval() == pytest.approx(before)
