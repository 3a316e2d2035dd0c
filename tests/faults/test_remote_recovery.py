"""After a remote outage: what was queued, and what is re-sent.

- Uploads still queued when the tier went down are remembered for the
  replay, not tried one by one against the dead store (each would wait out
  the timeout holding a CPU-pool buffer).
- The replay re-sends every entry written during the outage that a local
  tier holds, however small the CPU pool it reads them through.
- It never undoes a purge recorded during the outage: the remote purge log
  is read (and applied) before anything is re-sent.
- A cache closed before the store came back says how many it never re-sent
  (the list is in memory only: a restart forgets it).
"""

from __future__ import annotations

import logging
import threading

import redis
import torch

from lmcache_ec.config import load_config
from lmcache_ec.key import slug
from lmcache_ec.purge.inventory import Selector
from lmcache_ec.purge.marker import PurgeMarker, append_remote
from lmcache_ec.remote.catalog import open_catalog
from tests.conftest import make_tensor
from tests.faults.checks import snapshot, wait_for
from tests.remote.conftest import outage_config

MODEL = "test/recovery-model"
UPLOADERS = 4  # the remote store's upload threads (lmcache_connector.WORKERS)


def _remote(cache) -> dict:
    return snapshot(cache)["tiers"]["remote"]


def _stored_in(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return sum(1 for _ in client.scan_iter("*kv_bytes"))


def test_uploads_queued_when_the_tier_went_down_are_remembered_not_tried(
    black_hole, tmp_path, make_cache
):
    config = outage_config(f"redis://127.0.0.1:{black_hole.port}", local_disk=str(tmp_path))
    cache = make_cache(config, model=MODEL)
    puts = 3 * UPLOADERS
    for i in range(puts):
        assert cache.put(f"queued-{i}", make_tensor((4, 8), torch.bfloat16, seed=i))
    wait_for(lambda: _remote(cache)["pending"] == 0, 30, "the upload queue emptied")
    remote = _remote(cache)
    # The first uploads wait out the silent store; the ones queued behind them
    # find the tier down and are remembered without trying.
    assert remote["upload_skipped_unavailable"] == puts - UPLOADERS
    assert remote["awaiting_resend"] == puts


def test_every_write_of_an_outage_is_re_sent_through_a_small_pool(
    redis_process, tmp_path, make_cache
):
    # A 4 MB pool, 48 entries of 1 MB written during the outage: fewer than the
    # uploads a replay may queue fit in it.
    config = outage_config(redis_process.url, local_disk=str(tmp_path), max_local_cpu_size=0.004)
    cache = make_cache(config, model=MODEL)
    redis_process.kill()
    written = 48
    for i in range(written):
        assert cache.put(f"outage-{i}", make_tensor((512, 1024), torch.bfloat16, seed=i))
        assert cache.flush(30)  # on disk: its pool buffer free for the next put
    wait_for(lambda: _remote(cache)["awaiting_resend"] == written, 30, "every key remembered")
    redis_process.restart()
    # (awaiting_resend is 0 as soon as a replay starts: count what landed.)
    wait_for(lambda: _stored_in(redis_process.url) == written, 30, "every entry re-sent")
    assert _remote(cache)["awaiting_resend"] == 0


def test_a_purge_recorded_during_an_outage_is_not_undone_by_the_replay(
    redis_process, tmp_path, make_cache
):
    # The engine's own watch reads the remote log once at start, then not for a
    # minute: only the replay can notice the purge in time.
    config = outage_config(redis_process.url, local_disk=str(tmp_path), purge_check_s=60.0)
    cache = make_cache(config, model=MODEL)
    wait_for(lambda: cache._purges.watch.remote_checked, 30, "the watch's first read")
    health = cache._storage.storage_backends["RemoteBackend"].health
    probe, purged = health._probe_once, threading.Event()

    async def probe_once_purged():  # the engine sees the store only once it is purged
        if not purged.is_set():
            raise ConnectionError("still cut off")
        await probe()

    health._probe_once = probe_once_purged
    redis_process.kill()
    assert cache.put("written-while-cut-off", make_tensor((4, 8), torch.bfloat16))
    wait_for(lambda: _remote(cache)["awaiting_resend"] == 1, 30, "the key remembered")
    redis_process.restart()  # back, and purged (everything) before the engine sees it
    with open_catalog(load_config(config)) as catalog:
        append_remote(catalog, slug("default"), PurgeMarker.new(Selector()).to_line())
    purged.set()
    wait_for(
        lambda: _remote(cache)["available"] and _remote(cache)["awaiting_resend"] == 0,
        60,
        "the replay ran",
    )
    assert cache.flush(30)
    assert _stored_in(redis_process.url) == 0  # not re-sent
    assert cache.get("written-while-cut-off") is None  # and purged here too
    assert snapshot(cache)["purges_seen"] == 1


def test_writes_no_local_tier_holds_are_said_lost_not_re_sent(redis_process, make_cache, caplog):
    """Without a CPU or disk tier (``local_cpu: false``), what was written during the
    outage has no copy to re-send: one warning says how many never reach the store."""
    caplog.set_level(logging.INFO, logger="lmcache_ec.storage.replay")
    config = outage_config(redis_process.url, local_cpu=False)
    cache = make_cache(config, model=MODEL)
    redis_process.kill()
    written = 5
    for i in range(written):
        cache.put(f"outage-{i}", make_tensor((4, 8), torch.bfloat16, seed=i))
    wait_for(lambda: _remote(cache)["awaiting_resend"] == written, 30, "every key remembered")
    redis_process.restart()

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "during the outage" in r.getMessage()]

    wait_for(said, 30, "the replay ran")
    (line,) = said()  # nothing claims they were re-sent
    assert f"{written} entries written during the outage are held by no local tier" in line
    assert _remote(cache).get("resent", 0) == 0 and _stored_in(redis_process.url) == 0


def test_a_close_before_the_store_returns_says_how_many_were_never_re_sent(
    redis_process, tmp_path, make_cache, caplog
):
    config = outage_config(redis_process.url, local_disk=str(tmp_path))
    cache = make_cache(config, model=MODEL)
    redis_process.kill()
    for i in range(5):
        assert cache.put(f"unsent-{i}", make_tensor((4, 8), torch.bfloat16, seed=i))
    wait_for(lambda: _remote(cache)["awaiting_resend"] == 5, 30, "every key remembered")
    caplog.set_level(logging.WARNING, logger="lmcache_ec.remote.backend")
    cache.close()
    said = [r.getMessage() for r in caplog.records]
    assert sum("5 entries written while it was down were never re-sent" in m for m in said) == 1
