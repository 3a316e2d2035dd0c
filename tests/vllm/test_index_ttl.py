"""The scheduler index notices entries removed elsewhere, without deferring hits."""

from __future__ import annotations

import logging
import os
import threading
import time

import redis

from lmcache_ec.config import load_config
from lmcache_ec.integration.vllm import index as index_module
from lmcache_ec.integration.vllm.index import PENDING, TierIndex
from lmcache_ec.key import EncoderIdentity
from lmcache_ec.remote.catalog import open_catalog
from lmcache_ec.remote_names import redis_data_key

IDENTITY = EncoderIdentity(model="index/model")
ITEM = "a" * 64


def _wait_for(index: TierIndex, identifier: str, expected: str | None) -> None:
    deadline = time.monotonic() + 10
    while index.lookup(identifier) != expected:
        assert time.monotonic() < deadline, index.lookup(identifier)
        time.sleep(0.02)


def test_disk_answer_is_rechecked_after_the_ttl(tmp_path, monkeypatch):
    now = [1000.0]  # the index's clock, moved by hand: no timing in this test
    monkeypatch.setattr(index_module.time, "monotonic", lambda: now[0])
    index = TierIndex(
        IDENTITY, disk_dir=str(tmp_path), open_catalog=None, negative_ttl=0, positive_ttl=60
    )
    path = tmp_path / f"{IDENTITY.key(ITEM).storage_name}.pt"
    path.write_bytes(b"frame")
    assert index.lookup(ITEM) == "disk"
    os.remove(path)  # purged by another process
    now[0] += 59
    assert index.lookup(ITEM) == "disk"  # within the TTL: memory only
    now[0] += 2
    assert index.lookup(ITEM) is None


def _remote_index(redis_url: str, wrap=lambda catalog: catalog, **ttls) -> TierIndex:
    """An index over the remote tier at ``redis_url`` (its catalog through ``wrap``)
    whose entry for ``ITEM`` is stored; answered once, it says "remote"."""
    config = load_config({"remote_url": redis_url, "remote_timeout": 2})
    index = TierIndex(
        IDENTITY,
        disk_dir=None,
        open_catalog=lambda: wrap(open_catalog(config)),
        negative_ttl=60,
        **ttls,
    )
    redis.Redis.from_url(redis_url).set(_data_key(), b"frame")
    assert index.lookup(ITEM) == PENDING
    _wait_for(index, ITEM, "remote")
    return index


def _data_key() -> str:
    return redis_data_key(IDENTITY.key(ITEM).storage_name)


def test_remote_answer_is_revalidated_in_the_background(redis_url):
    index = _remote_index(redis_url, positive_ttl=0.2)
    try:
        redis.Redis.from_url(redis_url).delete(_data_key())  # purged elsewhere
        time.sleep(0.25)
        # Stale but believed present: answered at once, re-checked in the background.
        assert index.lookup(ITEM) == "remote"
        _wait_for(index, ITEM, None)
        assert index.remote_lookups == 2
    finally:
        index.close()


class _FirstAnswerLost:
    """A catalog whose first existence check goes unanswered (a dropped connection)."""

    def __init__(self, catalog) -> None:
        self.catalog = catalog
        self.calls = 0

    def lookup_many(self, names):
        self.calls += 1
        return [None] * len(names) if self.calls == 1 else self.catalog.lookup_many(names)

    def __getattr__(self, name):
        return getattr(self.catalog, name)


class _UnansweredUntilReleased:
    """A catalog whose existence checks wait for ``release`` and go unanswered."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self.last_error = "TimeoutError: never answered"

    def lookup_many(self, names):
        self.calls += 1
        self.asked.set()
        self.release.wait(10)
        return [None] * len(names)

    def close(self) -> None:
        pass


def test_a_closed_index_ends_its_check_without_retry_or_warning(caplog):
    # close() waits only so long; a check still in flight must then end quietly,
    # not ask again and warn into whatever runs next in the process.
    caplog.set_level(logging.WARNING, logger=index_module.__name__)
    catalog = _UnansweredUntilReleased()
    index = TierIndex(IDENTITY, disk_dir=None, open_catalog=lambda: catalog, negative_ttl=60)
    thread = index._thread
    assert index.lookup(ITEM) == PENDING
    assert catalog.asked.wait(10)
    index.close(timeout=0.01)  # the check is still waiting
    catalog.release.set()
    thread.join(10)
    assert not thread.is_alive()
    assert catalog.calls == 1
    assert index.remote_failures == 0
    assert not [r for r in caplog.records if "lookups paused" in r.getMessage()]


def test_one_unanswered_check_is_asked_again_not_paused(redis_url):
    index = _remote_index(redis_url, _FirstAnswerLost)
    try:
        assert index.remote_failures == 0  # no backoff: later items are still asked
        assert index.lookup("b" * 64) == PENDING
    finally:
        redis.Redis.from_url(redis_url).delete(_data_key())
        index.close()
