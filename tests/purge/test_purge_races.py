"""Purges that meet a read in flight, or an engine that was not running.

A purge applied by a running engine must leave nothing it selected behind,
even an entry a read had fetched before the purge and would store again
above (CPU tier, disk); an engine started after a purge that reached it only
through the remote tier applies it to its own directories.
"""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
import torch

from lmcache_ec.config import load_config
from lmcache_ec.key import slug
from lmcache_ec.purge.inventory import Selector
from lmcache_ec.purge.marker import PurgeMarker, append_disk, append_remote
from lmcache_ec.remote.catalog import open_catalog

MODEL = "org/raced"
INTERVAL = 0.2  # purge_check_s of the engines here
TENSOR = torch.ones(4, 8, dtype=torch.bfloat16)


def _config(disk, redis_url: str) -> dict:
    return {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk),
        "max_local_disk_size": 0.5,
        "remote_url": redis_url,
        "remote_timeout": 1.0,
        "purge_check_s": INTERVAL,
    }


def _entries(directory) -> list[str]:
    return [name for name in os.listdir(directory) if name.endswith(".pt")]


def _purge_remote(config: dict, storage_name: str) -> None:
    """What ``lmcache-ec purge --model`` does on the remote tier: delete, then record."""
    with open_catalog(load_config(config)) as catalog:
        assert catalog.delete(storage_name)
        append_remote(catalog, slug("default"), PurgeMarker.new(Selector(model=MODEL)).to_line())


def _engine_reading_x_from_the_remote(disk, redis_url: str, make_cache):
    """(config, engine); "x" is on the remote tier only."""
    config = _config(disk, redis_url)
    with make_cache({**config, "local_disk": None}, model=MODEL) as writer:
        assert writer.put("x", TENSOR) and writer.flush(30)
    return config, make_cache(config, model=MODEL)


def _get_x_while(engine, meanwhile) -> torch.Tensor | None:
    """``engine.get("x")``, its remote read running ``meanwhile(key)`` between
    fetching the frame and returning it."""
    remote = next(tier for tier in engine._storage.tiers() if tier.name == "remote")
    fetch = remote.read

    def read(key):
        data = fetch(key)
        meanwhile(key)
        return data

    remote.read = read
    try:
        return engine.get("x")
    finally:
        remote.read = fetch


def _wait_for(condition, what: str, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def test_a_read_in_flight_across_a_purge_does_not_store_its_entry_again(
    tmp_path, redis_url, make_cache
):
    disk = tmp_path / "disk"
    config, engine = _engine_reading_x_from_the_remote(disk, redis_url, make_cache)

    def purged_and_applied(key):  # after the fetch, before the read returns
        _purge_remote(config, key.storage_name)
        _wait_for(lambda: engine.stats.snapshot()["purges_seen"] == 1, "the purge applied")

    assert _get_x_while(engine, purged_and_applied) is not None  # read before the purge
    assert engine.flush(10)
    assert engine.get("x") is None  # neither kept in the CPU tier
    assert _entries(disk) == []  # nor written to the disk


def test_an_entry_a_read_wrote_back_before_the_engine_saw_the_purge_is_deleted(
    tmp_path, redis_url, make_cache
):
    disk = tmp_path / "disk"
    config, engine = _engine_reading_x_from_the_remote(disk, redis_url, make_cache)

    def purged(key):
        # The purger, meanwhile: deletes from the remote (the shared disk has
        # nothing yet), then records the purge on the disk log.
        with open_catalog(load_config(config)) as catalog:
            assert catalog.delete(key.storage_name)
        marker = PurgeMarker.new(Selector(model=MODEL))
        append_disk(str(disk), slug("default"), marker.to_line())

    # Written back to the CPU tier and the disk: the engine has not seen the purge.
    assert _get_x_while(engine, purged) is not None
    _wait_for(lambda: engine.get("x") is None and not _entries(disk), "the copy purged")


def test_an_engine_started_after_a_remote_purge_applies_it_to_its_own_disk(
    tmp_path, redis_url, make_cache
):
    # (The node tier's entries do not outlive the node's last process.)
    disk = tmp_path / "disk"
    config = _config(disk, redis_url)
    with make_cache(config, model=MODEL) as before:
        assert before.put("x", TENSOR) and before.flush(30)
        name = before.key("x").storage_name
    assert _entries(disk) == [f"{name}.pt"]
    _purge_remote(config, name)  # while no engine runs
    after = make_cache(config, model=MODEL)
    _wait_for(lambda: not _entries(disk), "the purge reached the engine's own disk")
    assert after.get("x") is None


def test_a_purge_too_long_for_its_readers_deletes_nothing(tmp_path, disk_dir, make_cache):
    from typer.testing import CliRunner

    from lmcache_ec.cli import app

    model = "org/" + "m" * 2000  # a long local path as a model name
    with make_cache({"local_disk": str(disk_dir)}, model=model) as cache:
        assert cache.put("x", TENSOR) and cache.flush(30)
    config = tmp_path / "ec.yaml"
    config.write_text(f"local_disk: {disk_dir}\n")
    result = CliRunner().invoke(app, ["purge", "--config", str(config), "--model", model])
    assert result.exit_code == 2 and "longer than" in result.output
    assert len(_entries(disk_dir)) == 1  # nothing deleted that no engine would hear of
    listed = CliRunner().invoke(app, ["ls", "--config", str(config), "--model", model])
    assert listed.exit_code == 0  # a listing of that selection is fine


def test_an_identity_of_another_namespace_is_refused(make_cache):
    cache = make_cache(namespace="tenant-a")
    other = dataclasses.replace(cache.identity, namespace="tenant-b")
    with pytest.raises(ValueError, match="namespace"):
        cache.set_identity(other)
    with pytest.raises(ValueError, match="namespace"):
        cache.put("x", TENSOR, identity=other)
    assert cache.identity.namespace == "tenant-a"


def test_a_read_begun_while_a_purge_is_applied_is_not_promoted(tmp_path, redis_url, make_cache):
    disk = tmp_path / "disk"
    _, engine = _engine_reading_x_from_the_remote(disk, redis_url, make_cache)
    engine._reader.purge_begins()
    # The purge under way when the read began is done before it returns.
    assert _get_x_while(engine, lambda key: engine._reader.purge_ends()) is not None
    assert engine.flush(10)
    assert engine.contains("x") == "remote" and _entries(disk) == []  # not kept above


def test_a_rescan_waits_only_for_the_writes_in_flight_when_it_began(make_cache, disk_dir):
    """Under a steady stream of writes it does not wait for a moment with none."""

    class Busy:  # a directory tier that always has a write in flight, a new one each look
        looks = 0

        def writes_in_flight(self):
            self.looks += 1
            return frozenset({f"write-{self.looks}"})

    cache = make_cache(purge_check_s=3600.0, close_timeout=30.0)
    started = time.monotonic()
    assert cache._purges._writes_landed([Busy()])
    assert time.monotonic() - started < 5  # well before close_timeout: not waited out
