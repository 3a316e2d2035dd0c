"""A purge an engine could not fully apply is applied again, not lost.

An entry of the engine's own directories that cannot be deleted (an I/O error:
EIO, EROFS, ESTALE) stops no other deletion; the purge is not counted
(``purges_seen``) and the next check applies it again, until every entry it
selected is gone. Each check tries once (no spinning) and the failure is logged
once. The checks here are made by the test itself (``check_remote`` on a
stand-in for the remote store, ``poll_disk`` with an explicit clock), so
nothing depends on timing.
"""

from __future__ import annotations

import errno
import logging
import os

import torch

from lmcache_ec.key import slug
from lmcache_ec.purge import selection
from lmcache_ec.purge.inventory import Selector
from lmcache_ec.purge.marker import MarkerWatch, PurgeIncomplete, PurgeMarker, append_disk

MODEL = "org/purged"
SHAPE = (4, 8)
NEVER = 3600.0  # purge_check_s: the engine's own thread stays out of the way


class _RemoteLog:
    """The remote store as the watch reads it: one purge log."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read_log(self, name: str, limit: int) -> bytes | None:
        return self.data[-limit:] or None


def test_an_entry_left_by_an_io_error_is_deleted_at_the_next_check(
    disk_dir, caplog, monkeypatch, make_cache
):
    config = {"local_cpu": True, "max_local_cpu_size": 0.05, "local_disk": str(disk_dir)}
    cache = make_cache(config, model=MODEL, purge_check_s=NEVER)
    names = [f"img-{i}" for i in range(3)]
    for name in names:
        assert cache.put(name, torch.ones(SHAPE))
    assert cache.flush(10)
    paths = {name: str(disk_dir / f"{cache.key(name).storage_name}.pt") for name in names}
    assert all(os.path.exists(path) for path in paths.values())

    stuck = paths["img-1"]
    attempts: list[str] = []
    remove = os.remove
    failing = True

    def flaky_remove(path, *args, **kwargs):
        if path == stuck:
            attempts.append(path)
            if failing:
                raise OSError(errno.EIO, "Input/output error", path)
        return remove(path, *args, **kwargs)

    monkeypatch.setattr(selection.os, "remove", flaky_remove)
    caplog.set_level(logging.WARNING, logger="lmcache_ec")
    log = _RemoteLog(PurgeMarker.new(Selector(model=MODEL)).to_line())
    watch = cache._purges.watch
    for check in range(1, 4):
        watch.check_remote(log)
        assert len(attempts) == check  # once per check
        assert cache.stats.snapshot()["purges_seen"] == 0  # not applied yet
        assert [os.path.exists(paths[name]) for name in names] == [False, True, False]
        assert cache.get("img-1") is not None  # still on disk (read into the CPU tier)
    warned = [r for r in caplog.records if "not fully applied" in r.getMessage()]
    assert len(warned) == 1  # once, not once per check

    failing = False  # the disk recovered
    watch.check_remote(log)
    assert not os.path.exists(stuck)
    assert cache.stats.snapshot()["purges_seen"] == 1
    assert [cache.get(name) for name in names] == [None] * 3  # the CPU copy too
    watch.check_remote(log)  # applied: counted once, not tried again
    assert cache.stats.snapshot()["purges_seen"] == 1
    assert len(attempts) == 4


def test_an_incomplete_purge_from_the_disk_log_is_read_again(disk_dir):
    """The disk log is read again though it did not change."""
    applied: list[str] = []

    def on_purge(marker: PurgeMarker, tier: str) -> None:
        applied.append(marker.generation)
        if len(applied) == 1:
            raise PurgeIncomplete("one entry left")

    watch = MarkerWatch(str(disk_dir), "default", 1.0, on_purge)
    marker = PurgeMarker.new(Selector(model=MODEL))
    append_disk(str(disk_dir), slug("default"), marker.to_line())
    assert watch.poll_disk(now=10.0)
    assert not watch.poll_disk(now=10.5)  # not before the interval
    assert watch.poll_disk(now=11.0)
    assert not watch.poll_disk(now=12.0)  # applied: handled once
    assert applied == [marker.generation] * 2


def test_a_remote_purge_left_incomplete_keeps_its_part_when_seen_on_disk(disk_dir):
    """Seen next on the disk log, a remote record still deletes the engine's
    own entries (only a remote record does)."""
    applied: list[str] = []

    def on_purge(marker: PurgeMarker, tier: str) -> None:
        applied.append(tier)
        if len(applied) == 1:
            raise PurgeIncomplete("one entry left")

    watch = MarkerWatch(str(disk_dir), "default", 1.0, on_purge)
    line = PurgeMarker.new(Selector(model=MODEL)).to_line()
    assert watch.check_remote(_RemoteLog(line))
    append_disk(str(disk_dir), slug("default"), line)
    assert watch.poll_disk(now=10.0)
    assert applied == ["remote", "remote"]


def test_a_replay_does_not_trust_a_purge_log_read_that_left_a_purge_incomplete(
    disk_dir, monkeypatch, make_cache
):
    """Writes of an outage are re-sent only once the remote purge log was read
    and every purge in it applied: an entry a purge could not delete from this
    engine's disk must not reach the store again."""
    log = _RemoteLog(b"")
    log.close = lambda: None
    monkeypatch.setattr(selection, "open_remote", lambda config: log)
    config = {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "remote_url": "redis://127.0.0.1:1",  # the log is the stand-in above
    }
    cache = make_cache(config, model=MODEL, purge_check_s=NEVER)
    assert cache.put("img", torch.ones(SHAPE)) and cache.flush(10)
    stuck = str(disk_dir / f"{cache.key('img').storage_name}.pt")
    remove, failing = os.remove, [True]

    def flaky_remove(path, *args, **kwargs):
        if path == stuck and failing[0]:
            raise OSError(errno.EIO, "Input/output error", path)
        return remove(path, *args, **kwargs)

    monkeypatch.setattr(selection.os, "remove", flaky_remove)
    log.data = PurgeMarker.new(Selector(model=MODEL)).to_line()
    assert cache._purges.read_remote_now() is False  # read, but the purge left img
    assert os.path.exists(stuck)
    failing[0] = False
    assert cache._purges.read_remote_now() is True  # applied again, and through
    assert not os.path.exists(stuck)
