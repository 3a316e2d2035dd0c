"""Each launched engine has stage sockets of its own.

A socket is named by a digest of the engine id and vLLM's ``instance_id`` (new
at each launch, the same in the engine core and its workers): two engines
launched from one config template (one engine id), or with ids a file name
cannot tell apart, never share a socket, so a scheduler only ever orders its
own workers. These tests run vLLM's real Scheduler with V1's call pattern.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from lmcache_ec.runtime_dirs import SOCKET_PATH_MAX, socket_path
from tests.conftest import bit_equal

from .harness import Engine, encoder_output, image_hash, make_vllm_config, stored_by_a_producer

_NAME = re.compile(
    r"(?:(?P<readable>[A-Za-z0-9_-]+)-)?[0-9a-f]{16}-dp(?P<dp>\d+)-tp(?P<tp>\d+)\.sock"
)


def test_two_engines_launched_with_one_engine_id_each_stage_only_their_own_orders(
    model_config, extra
):
    images = [image_hash(f"one-engine-id-{i}.png") for i in range(4)]
    stored_by_a_producer(model_config, extra, images)
    engines = []
    for _ in "ab":  # one config template, two launches
        config = make_vllm_config(model_config, "ec_both", extra)
        config.ec_transfer_config.engine_id = "encoder-engine"
        engines.append(Engine(config, runner="v1"))
    staged_by: list[list[str]] = [[], []]
    try:
        for engine, staged in zip(engines, staged_by, strict=True):
            listener = engine.workers[0]._listener
            assert listener is not None  # the second launch's workers bound too
            assert engine.connector.scheduler.channel.paths == [listener.path]
            stage = engine.workers[0].worker.stage

            def record(identifiers, weights, link, *rest, stage=stage, staged=staged, **rows):
                staged.extend(identifiers)
                return stage(identifiers, weights, link, *rest, **rows)

            engine.workers[0].worker.stage = record
        for engine, mine in zip(engines, (images[:2], images[2:]), strict=True):
            for image in mine:
                engine.run_until_finished([engine.add_request([image])])
        assert staged_by == [images[:2], images[2:]]
        for engine, mine in zip(engines, (images[:2], images[2:]), strict=True):
            assert engine.encoded == []
            assert engine.ec_stats["loads"] == 2
            for image in mine:
                assert bit_equal(engine.gathered[image], encoder_output(image))
        assert all(engine.workers[0].worker.staged_bytes == 0 for engine in engines)
    finally:
        for engine in engines:
            engine.shutdown()


def test_engine_ids_a_file_name_cannot_tell_apart_get_sockets_of_their_own():
    long = "multimodal-encoder-production-us-east-1-cluster-7-deployment-000"
    alike = [
        ("encoder.a", "1"),
        ("encoder_a", "1"),
        ("team/enc", "1"),
        ("team:enc", "1"),
        (f"{long}1", "1"),
        (f"{long}2", "1"),
        ("encoder.a", "2"),  # the same engine id, launched again
    ]
    paths = [socket_path(engine, 0, 0, instance=instance) for engine, instance in alike]
    assert len(set(paths)) == len(alike)
    # Workers and their scheduler name the socket alike, and a person can read it.
    assert socket_path("encoder.a", 1, 3, instance="1") == socket_path(
        "encoder.a", 1, 3, instance="1"
    )
    name = _NAME.fullmatch(os.path.basename(socket_path("encoder.a", 1, 3, instance="1")))
    assert name is not None and name["readable"] == "encoder_a"
    assert (name["dp"], name["tp"]) == ("1", "3")


def test_a_socket_name_fits_a_unix_socket_under_a_long_directory(monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    root = tempfile.mkdtemp()  # short: pytest's tmp_path could not hold even a digest
    try:
        # A directory of 70 bytes: room for the digest's name, not the readable part too.
        mine = f"lmcache-ec-{os.getuid()}"
        base = os.path.join(root, "x" * (70 - len(root) - len(mine) - 2))
        os.mkdir(base)
        paths = {socket_path("e" * 100, 0, 3, base, instance=str(i)) for i in range(2)}
        assert len(paths) == 2
        for path in paths:
            assert len(os.fsencode(path)) <= SOCKET_PATH_MAX
            name = _NAME.fullmatch(os.path.basename(path))
            assert name is not None and name["readable"] is None  # the digest alone
    finally:
        shutil.rmtree(root)
