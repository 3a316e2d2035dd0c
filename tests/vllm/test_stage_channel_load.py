"""The stage channel under load: thousands of items a step, a paused scheduler, a hostile peer.

vLLM's real Scheduler with Model Runner V1's call pattern (``harness.py``).
A first instance encodes 5,146 images in one step and saves them to disk;
the worker's report of those saves (about 350 KB, more than a socket buffer
holds) reaches the scheduler over the channel. A second instance asks for the
same images: one step orders every one of them over the channel, the
scheduler then stops reading for 2 s mid-run, and all the while a peer that
sent half a frame and never reads sits on each worker's socket. Every request
finishes, every image loads (none is encoded twice) and every tensor is
bit-exact. The step time the connector adds is measured by ``lmcache-ec
bench channel``, not here. Cost: about 25 s on 2 busy cores.
"""

from __future__ import annotations

import itertools
import time

from lmcache_ec.bench.channel_load import HostilePeer
from lmcache_ec.runtime_dirs import socket_path
from tests.conftest import bit_equal

from .harness import NUM_EMBEDS, Engine, encoder_output, image_hash, make_vllm_config

REQUESTS = 83
IMAGES_PER_REQUEST = 62  # 4 tokens each, then 4 of text: within max_model_len (256)
PROMPT = IMAGES_PER_REQUEST * NUM_EMBEDS + 4
ITEMS = REQUESTS * IMAGES_PER_REQUEST


def _engine(model_config, extra: dict) -> tuple[Engine, HostilePeer]:
    config = make_vllm_config(
        model_config,
        "ec_both",
        extra,
        max_num_seqs=REQUESTS + 1,
        max_num_batched_tokens=REQUESTS * PROMPT + 64,  # no prompt split over steps
        num_blocks=REQUESTS * 17 + 64,
    )
    engine = Engine(config, runner="v1")
    return engine, HostilePeer(
        socket_path(config.ec_transfer_config.engine_id, 0, 0, instance=config.instance_id)
    )


def test_thousands_of_items_a_step_through_a_paused_scheduler_and_a_hostile_peer(
    model_config, disk_dir
):
    extra = {
        "lmcache_config": {
            "max_local_cpu_size": 0.2,
            "local_disk": str(disk_dir),
            "max_local_disk_size": 1.0,
        },
        "max_pending_saves": 2 * ITEMS,
        "max_inflight_items": 2 * ITEMS,
        "claim_encodes": False,
        # Reading 5,000 entries one order at a time takes seconds on a loaded
        # 2-core machine: the test is about the channel, not about that speed.
        "stage_timeout_s": 60.0,
    }
    images = [image_hash(f"load-{i}.png") for i in range(ITEMS)]
    batches = [images[i : i + IMAGES_PER_REQUEST] for i in range(0, ITEMS, IMAGES_PER_REQUEST)]

    # Pass 1: one step encodes every image; their saves go out in one report.
    engine, hostile = _engine(model_config, extra)
    try:
        engine.run_until_finished([engine.add_request(batch) for batch in batches])
        assert sorted(engine.encoded) == sorted(images)
        assert max(len(step) for step in engine.scheduled) == REQUESTS
        engine.flush()
        engine.run_until_finished([engine.add_request([])])  # the step that reports them
        assert engine.ec_stats["saves_submitted"] == ITEMS
        assert engine.ec_stats.get("scheduler_channel_breaks", 0) == 0
        assert hostile.connections >= 1
    finally:
        hostile.stop()
        engine.shutdown()

    # Pass 2, a new instance: one step orders every image over the channel;
    # the scheduler then pauses for 2 s while the worker answers.
    engine, hostile = _engine(model_config, extra)
    try:
        requests = [engine.add_request(batch) for batch in batches]
        engine.step()
        time.sleep(2.0)
        engine.run_until_finished(requests)

        assert max(len(step) for step in engine.stage_orders) >= 5000  # one step's orders
        assert set(itertools.chain(*engine.stage_orders)) == set(images)
        assert engine.encoded == []  # every image loaded, none encoded again
        assert sorted(itertools.chain(*engine.loads)) == sorted(images)
        for image in images:
            assert bit_equal(engine.gathered[image], encoder_output(image))
        assert engine.ec_stats.get("load_direct_reads", 0) == 0
        assert engine.ec_stats.get("scheduler_stage_given_up", 0) == 0
        assert engine.ec_stats.get("scheduler_channel_breaks", 0) == 0
        assert hostile.connections >= 1
    finally:
        hostile.stop()
        engine.shutdown()
