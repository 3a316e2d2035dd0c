"""The scheduler's TierIndex forgets its positive answers after a purge elsewhere."""

from __future__ import annotations

import dataclasses
import time

import redis

from lmcache_ec.config import load_config
from lmcache_ec.integration.vllm import index as index_module
from lmcache_ec.integration.vllm.index import PENDING, TierIndex
from lmcache_ec.key import EncoderIdentity, slug
from lmcache_ec.purge.inventory import Selector
from lmcache_ec.purge.marker import PurgeMarker, append_disk, append_remote
from lmcache_ec.remote.catalog import open_catalog
from lmcache_ec.remote_names import redis_data_key

IDENTITY = EncoderIdentity(model="index/model")
ITEM = "b" * 64
INTERVAL = 0.5
REMOTE_TIMEOUT = 1.0


def test_disk_marker_clears_remembered_answers(tmp_path, monkeypatch):
    now = [1000.0]  # the index's clock, moved by hand
    monkeypatch.setattr(index_module.time, "monotonic", lambda: now[0])
    index = TierIndex(
        IDENTITY,
        disk_dir=str(tmp_path),
        open_catalog=None,
        negative_ttl=0,
        positive_ttl=60,
        purge_check_s=INTERVAL,
    )
    path = tmp_path / f"{IDENTITY.key(ITEM).storage_name}.pt"
    path.write_bytes(b"frame")
    index.note_present("worker-item", "worker")
    assert index.lookup(ITEM) == "disk"
    path.unlink()  # purged by another process, which then writes its marker
    marker = dataclasses.replace(
        PurgeMarker.new(Selector(model=IDENTITY.model)), time=time.time() - 1
    )
    append_disk(str(tmp_path), slug(IDENTITY.namespace), marker.to_line())
    now[0] += INTERVAL / 2
    assert index.lookup(ITEM) == "disk"  # remembered until the next check
    now[0] += INTERVAL / 2
    assert index.lookup(ITEM) is None  # the check ran: every answer forgotten
    assert index.lookup("worker-item") is None
    assert index.purges_seen == 1
    # The purger's record after its deletes: same generation, later time.
    index.note_present("worker-item", "worker")
    later = dataclasses.replace(marker, time=marker.time + 0.001)
    append_disk(str(tmp_path), slug(IDENTITY.namespace), later.to_line())
    now[0] += INTERVAL
    assert index.lookup("worker-item") is None  # forgotten again
    assert index.purges_seen == 1  # one purge


def test_remote_marker_clears_remembered_answers(redis_url):
    config = load_config({"remote_url": redis_url, "remote_timeout": REMOTE_TIMEOUT})
    index = TierIndex(
        IDENTITY,
        disk_dir=None,
        open_catalog=lambda: open_catalog(config),
        negative_ttl=60,
        positive_ttl=60,  # without a purge, the positive answer would stand for 60 s
        purge_check_s=INTERVAL,
    )
    client = redis.Redis.from_url(redis_url)
    data_key = redis_data_key(IDENTITY.key(ITEM).storage_name)
    try:
        client.set(data_key, b"frame")
        assert index.lookup(ITEM) == PENDING
        deadline = time.monotonic() + 10
        while index.lookup(ITEM) != "remote":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        client.delete(data_key)
        with open_catalog(config) as catalog:
            line = PurgeMarker.new(Selector(model=IDENTITY.model)).to_line()
            append_remote(catalog, slug(IDENTITY.namespace), line)
        # Bound: one marker read every purge_check_s, each within remote_timeout.
        time.sleep(INTERVAL + REMOTE_TIMEOUT)
        assert index.purges_seen == 1
        assert index.lookup(ITEM) in (PENDING, None)  # asked again, not "remote"
        deadline = time.monotonic() + 10
        while index.lookup(ITEM) is not None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        index.close()
        client.close()
