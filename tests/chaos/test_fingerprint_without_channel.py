"""No stage channel, with ``weights_fingerprint`` on: a cache that says why it does not hit.

Keys carry a fingerprint of the encoder weights, which the workers take. The
scheduler hears it over the stage channel; where there is none (a rank on
another node, or no private directory for the sockets), the fingerprint
comes with the workers' step reports. Where even those never arrive (an
encode-only instance on Model Runner V1), caching is paused: one warning at
start, and the ``caching`` feature reads off in the stats, with why.

vLLM's real Scheduler, the harness's V1 call pattern, real tiers.
"""

from __future__ import annotations

# isort: off
from tests.vllm import cpu_env as vllm_env  # vLLM's CPU environment, set before vllm loads

# isort: on
import logging
import os
import tempfile

import pytest

from lmcache_ec.integration.vllm.connector_options import ConnectorSettings
from lmcache_ec.integration.vllm.plugin import register
from lmcache_ec.integration.vllm.worker import TierWorker
from tests.conftest import bit_equal
from tests.vllm.harness import Engine, encoder_output, image_hash, make_vllm_config

SQUATTER = 65534  # nobody


@pytest.fixture(scope="module")
def model_config():
    from vllm.config import ModelConfig

    register()  # what vLLM's general-plugin loader does at start-up
    return ModelConfig(
        model=vllm_env.MODEL_DIR,
        tokenizer=vllm_env.MODEL_DIR,
        max_model_len=256,
        dtype="bfloat16",
    )


@pytest.fixture
def extra(disk_dir):
    return {
        "lmcache_config": {
            "max_local_cpu_size": 0.01,
            "local_disk": str(disk_dir),
            "max_local_disk_size": 0.1,
        }
    }


@pytest.fixture
def no_socket_dir(extra, tmp_path, monkeypatch):
    """Every directory the stage sockets could use is another user's: the
    runtime directory under node_dir and the temp directory's, with no
    private alternative (no home to keep a token in) and no $XDG_RUNTIME_DIR."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the squatter's directory is made as uid 65534 (chown)")
    base = tmp_path / "shm"
    base.mkdir()
    os.chmod(base, 0o1777)
    taken = base / f"lmcache-ec-{os.getuid()}"
    taken.mkdir()
    os.chmod(taken, 0o777)
    os.chown(taken, SQUATTER, SQUATTER)
    not_a_home = tmp_path / "not-a-home"
    not_a_home.write_text("")
    monkeypatch.setenv("HOME", str(not_a_home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    extra["lmcache_config"]["node_dir"] = str(base)
    return taken


def _store(model_config, extra: dict, image: str) -> None:
    """A first instance encodes ``image`` and saves it to the shared disk tier."""
    writer = Engine(make_vllm_config(model_config, "ec_both", extra), runner="v1")
    try:
        writer.run_until_finished([writer.add_request([image])])
        assert writer.encoded == [image]
        writer.flush()
    finally:
        writer.shutdown()


def _served_during_a_decode(engine: Engine, image: str) -> None:
    """``image`` asked while another request decodes: every step schedules
    tokens, so V1 runs the connector's hooks and step metadata flows."""
    busy = engine.add_request([], max_tokens=40)
    engine.step()
    engine.run_until_finished([engine.add_request([image])])
    engine.run_until_finished([busy])


def _level(engine: Engine, feature: str) -> dict[str, float]:
    """The level of ``feature_off`` of ``feature`` (processes with it off), by reason."""
    prefix = f"feature_off:{feature}:"
    return {
        key[len(prefix) :]: value
        for key, value in engine.ec_stats.items()
        if key.startswith(prefix) and value
    }


def test_the_scheduler_starts_without_a_socket_directory_and_serves_hits(
    model_config, extra, no_socket_dir, caplog
):
    image = image_hash("no-socket-dir.png")
    with caplog.at_level(logging.WARNING):
        _store(model_config, extra, image)
        engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner="v1")
    try:
        assert engine.connector.scheduler.channel is None
        _served_during_a_decode(engine, image)
        assert engine.encoded == []  # loaded: orders and answers rode step metadata
        assert bit_equal(engine.gathered[image], encoder_output(image))
        assert engine.ec_stats["loads"] == 1
        # The scheduler and the worker rank each have the channel off.
        assert _level(engine, "stage_channel") == {"directory_taken": 2}
        assert _level(engine, "caching") == {}
    finally:
        engine.shutdown()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stage_channel")]
    assert len(said) == 1, said  # one per path and process, whoever met it first
    assert str(no_socket_dir) in said[0] and "uid 65534" in said[0]
    assert os.listdir(no_socket_dir) == []


def test_without_a_channel_the_fingerprint_arrives_with_the_step_reports(model_config, extra):
    image = image_hash("fingerprint-in-step-metadata.png")
    _store(model_config, extra, image)
    engine = Engine(make_vllm_config(model_config, "ec_both", extra), runner="v1")
    engine.workers[0]._listener.close()  # a rank the scheduler cannot reach
    try:
        _served_during_a_decode(engine, image)
        assert not engine.connector.scheduler.channel.connected
        assert engine.connector.scheduler.weights == engine.workers[0].worker.weights
        assert engine.encoded == []  # the stored output was found and loaded
        assert bit_equal(engine.gathered[image], encoder_output(image))
        assert _level(engine, "caching") == {}
    finally:
        engine.shutdown()


@pytest.mark.parametrize("cause", ["no socket directory", "channel unreachable"])
def test_an_encode_only_instance_on_v1_without_a_channel_says_caching_is_paused(
    model_config, extra, cause, request, caplog
):
    if cause == "no socket directory":
        request.getfixturevalue("no_socket_dir")
    image = image_hash(f"paused-{cause}.png")
    with caplog.at_level(logging.WARNING):
        engine = Engine(make_vllm_config(model_config, "ec_producer", extra), runner="v1")
        if cause == "channel unreachable":
            engine.workers[0]._listener.close()
        try:
            engine.run_until_finished([engine.add_request([image])])
            assert engine.encoded == [image]
            assert _level(engine, "caching") == {"weights_unreachable": 1}
        finally:
            engine.shutdown()
    paused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Caching paused")]
    assert len(paused) == 1, paused
    assert "weights_fingerprint: false" in paused[0]


def test_a_weights_change_is_reported_even_with_nothing_else_to_say(make_cache):
    """Without a channel the step report is the scheduler's only news of new
    weights: a report that would otherwise be empty still carries them."""
    cache = make_cache(model="m/announce")
    worker = TierWorker(
        cache,
        ConnectorSettings(),
        persistable=lambda identifier: True,
        is_producer=True,
        is_consumer=True,
        weights_known=False,
    )
    try:
        worker.build_worker_meta()  # what start-up left to say
        assert worker.build_worker_meta() is None  # nothing happened since
        worker.set_weights("weights-2")
        report = worker.build_worker_meta()
        assert report is not None and report.weights == "weights-2"
        assert worker.build_worker_meta() is None  # said once
    finally:
        worker.close()
