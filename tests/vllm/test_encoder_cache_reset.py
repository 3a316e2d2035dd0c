"""After vLLM empties its encoder cache, an image asked for again loads from the tiers.

``reset_encoder_cache`` (a reload of the weights, ``pause_generation(clear_cache=True)``,
the ``/reset_encoder_cache`` endpoint) empties vLLM's scheduler-side encoder cache
without naming what it freed. vLLM's real Scheduler (``harness.py``), both model
runners: an image computed once, then reset away twice, is loaded both times after
(from its RESIDENT record, then from its LOADED one), never encoded again.
"""

from __future__ import annotations

import time

import pytest

from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.index import TierIndex
from lmcache_ec.integration.vllm.items import ItemState
from lmcache_ec.integration.vllm.scheduler import TierScheduler
from lmcache_ec.key import EncoderIdentity
from tests.conftest import bit_equal

from .harness import Engine, encoder_output, image_hash, make_vllm_config

S = ItemState


def _until_the_index_finds(scheduler: TierScheduler, image: str) -> None:
    """A flushed save reaches the scheduler's index with the worker's next report,
    or through the disk listing within about 10 ms of the write (docs/vllm.md);
    an image asked for sooner is encoded again, as it should be."""
    deadline = time.monotonic() + 30
    while scheduler.index.lookup(image) is None:
        assert time.monotonic() < deadline, "the saved image never reached the index"
        time.sleep(0.005)


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_an_image_asked_for_after_a_reset_is_fetched_again(model_config, extra, runner):
    image = image_hash(f"reset-{runner}.png")
    engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner=runner)
    scheduler = engine.connector.scheduler
    try:
        engine.run_until_finished([engine.add_request([image])])
        engine.flush()
        assert engine.encoded == [image]
        _until_the_index_finds(scheduler, image)
        for state_before in (S.RESIDENT, S.LOADED):
            assert scheduler.items.state(image) is state_before
            engine.update_weights(engine.weights_seed)  # the same weights, reloaded
            engine.run_until_finished([engine.add_request([image])])
            assert engine.encoded == [image]  # loaded, not encoded again
            assert bit_equal(engine.gathered[image], encoder_output(image))
        assert engine.ec_stats["loads"] == 2
        assert engine.ec_stats["scheduler_encoder_cache_resets"] == 2
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    "path",
    [[S.RESIDENT], [S.QUEUED, S.STAGING, S.READY, S.PROMISED, S.LOADED]],
    ids=["resident", "loaded"],
)
def test_an_item_vllm_asks_about_is_no_longer_in_its_cache(path):
    """vLLM asks ``has_cache_item`` only for what its own cache lacks: a record saying
    otherwise is stale (a reset no seam reported) and is dropped."""
    index = TierIndex(EncoderIdentity(model="m"), disk_dir=None, open_catalog=None, negative_ttl=1)
    scheduler = TierScheduler(
        ConnectorSettings(),
        index,
        is_producer=True,
        is_consumer=True,
        tp_size=1,
        deliver_on_idle=True,
    )
    image = image_hash("stale.png")
    try:
        for state in path:
            scheduler.items.move(image, state, 1e12)
        assert not scheduler.has_cache_item(image)
        assert scheduler.items.state(image) is S.UNKNOWN
        assert scheduler.take_stats()["scheduler_stale_items"] == 1
    finally:
        index.close()
