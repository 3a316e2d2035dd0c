"""The purge log: no purge lost, records untrusted, each scoped to its namespace.

Running engines (``ECCache`` in this process, ``purge_check_s`` short) follow
the purge logs of their own namespace; records are appended the way
``lmcache-ec purge`` appends them (``purge.marker.append_disk`` /
``append_remote``), or planted as raw bytes where a test needs a hostile one.
Every wait is bounded by a deadline and asserts what the engine did, never how
fast.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from lmcache_ec import ECCache
from lmcache_ec.config import load_config
from lmcache_ec.integration.vllm.index import TierIndex
from lmcache_ec.key import EncoderIdentity, slug
from lmcache_ec.purge.inventory import Selector
from lmcache_ec.purge.marker import (
    LOG_LIMIT,
    BadRecord,
    MarkerWatch,
    PurgeMarker,
    append_disk,
    append_remote,
    disk_path,
    log_name,
    read_disk,
    read_remote,
    records,
)
from lmcache_ec.remote.catalog import open_catalog
from tests.conftest import bit_equal, make_tensor
from tests.remote.conftest import remote_config

MODEL = "org/purged"
INTERVAL = 0.2  # purge_check_s of the engines here
SHAPE = (4, 8)


def _line(**select) -> bytes:
    return PurgeMarker.new(Selector(**select)).to_line()


def _wait_for(condition, what: str, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _purges_seen(cache: ECCache) -> int:
    return cache.stats.snapshot()["purges_seen"]


def _hit_tier(cache: ECCache, mm_hash: str) -> str | None:
    """The tier that served ``mm_hash`` (None: a miss)."""
    before = dict(cache.stats.snapshot()["hits"])
    found = cache.get(mm_hash)
    after = cache.stats.snapshot()["hits"]
    if found is None:
        return None
    return next(t for t in after if after[t] != before.get(t, 0))


# -- the log itself ------------------------------------------------------------


def test_appends_made_at_once_are_all_kept_on_disk(tmp_path):
    lines = [_line(model=f"m{i}") for i in range(24)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda line: append_disk(str(tmp_path), slug("a"), line), lines))
    assert sorted(records(read_disk(str(tmp_path), "a"))) == sorted(x.strip() for x in lines)
    assert os.stat(disk_path(str(tmp_path), "a")).st_mode & 0o777 == 0o600


def test_appends_made_at_once_are_all_kept_remotely(remote):
    lines = [_line(model=f"m{i}") for i in range(16)]
    config = load_config(remote_config(**remote))
    catalogs = [open_catalog(config) for _ in range(4)]
    try:
        with ThreadPoolExecutor(4) as pool:
            list(
                pool.map(
                    lambda i: append_remote(catalogs[i % 4], slug("a"), lines[i]),
                    range(len(lines)),
                )
            )
        found = records(read_remote(catalogs[0], "a"))
        assert sorted(found) == sorted(x.strip() for x in lines)
    finally:
        for catalog in catalogs:
            catalog.close()


def test_a_log_keeps_its_newest_whole_records_within_its_limit(tmp_path, redis_url):
    lines = [_line(model=f"model-{i:04d}" + "x" * 200) for i in range(LOG_LIMIT // 200)]
    with open_catalog(load_config({"remote_url": redis_url})) as catalog:
        for line in lines:
            append_disk(str(tmp_path), slug("a"), line)
            append_remote(catalog, slug("a"), line)
        remote_log = read_remote(catalog, "a")
    for data in (read_disk(str(tmp_path), "a"), remote_log):
        assert len(data) <= LOG_LIMIT
        kept = records(data)
        assert kept == [x.strip() for x in lines[-len(kept) :]]  # the newest, whole
        assert len(kept) >= LOG_LIMIT // len(lines[0]) - 1


def test_a_long_log_is_read_as_its_tail(disk_dir, redis_url):
    """A log grown past its limit by another writer costs a reader ``LOG_LIMIT + 1``
    bytes; the newest records are still found."""
    disk_dir.mkdir(exist_ok=True)
    junk = b"x" * (1 << 20)
    last = _line(model=MODEL)
    config = _config(disk_dir, remote_url=redis_url, remote_timeout=5)
    with open_catalog(load_config(config)) as catalog:
        catalog.store._client.set(log_name("default"), junk + b"\n" + last)
        _plant(disk_dir, "default", junk, last.strip())
        for data in (read_remote(catalog, "default"), read_disk(str(disk_dir), "default")):
            assert len(data) == LOG_LIMIT + 1
            assert records(data) == [last.strip()]


# -- records are untrusted -----------------------------------------------------

HOSTILE = {
    "nested-5k": b"[" * 5000,
    "nested-4k": b"[" * 4000,  # under the size limit: the parser's depth is the guard
    "not-json": b"\xff\xfe{",
    "a-list": b"[1, 2]",
    "nan-time": b'{"v":1,"generation":"ab","time":NaN,"select":{}}',
    "infinite-time": b'{"v":1,"generation":"ab","time":Infinity,"select":{}}',
    "negative-time": b'{"v":1,"generation":"ab","time":-5,"select":{}}',
    "bool-time": b'{"v":1,"generation":"ab","time":true,"select":{}}',
    "nan-age": b'{"v":1,"generation":"ab","time":5,"select":{"older_than":NaN}}',
    "model-not-text": b'{"v":1,"generation":"ab","time":5,"select":{"model":7}}',
    "unknown-field": b'{"v":1,"generation":"ab","time":5,"select":{"all":true}}',
    "extra-field": b'{"v":1,"generation":"ab","time":5,"select":{},"x":1}',
    "bad-generation": b'{"v":1,"generation":"../x","time":5,"select":{}}',
    "other-version": b'{"v":2,"generation":"ab","time":5,"select":{}}',
    "long-text": json.dumps(
        {"v": 1, "generation": "ab", "time": 5, "select": {"model": "m" * 2000}}
    ).encode(),
    "other-namespace": b'{"v":1,"generation":"ab","time":5,"select":{"namespace":"b"}}',
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_bad_record_is_rejected(kind):
    with pytest.raises(BadRecord):
        PurgeMarker.parse(HOSTILE[kind], "a", now=time.time())


def test_a_record_from_the_future_is_clamped_to_the_readers_clock():
    now = time.time()
    line = json.dumps({"v": 1, "generation": "ab", "time": now + 30, "select": {}}).encode()
    marker = PurgeMarker.parse(line, "a", now=now)
    assert marker.time == now and math.isfinite(marker.selector("a").created_before)
    # Unscoped, it selects the log's namespace and nothing else.
    assert marker.selector("a").namespace == "a"


def _plant(directory, namespace: str, *lines: bytes) -> None:
    """Raw lines appended to a disk log, as a hostile writer would."""
    with open(disk_path(str(directory), namespace), "ab") as stream:
        for line in lines:
            stream.write(line + b"\n")


def _config(disk_dir, **extra) -> dict:
    return {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": str(disk_dir),
        "purge_check_s": INTERVAL,
        **extra,
    }


def test_bad_records_are_logged_once_and_later_purges_still_apply(disk_dir, caplog, make_cache):
    disk_dir.mkdir(exist_ok=True)
    cache = make_cache(_config(disk_dir), model=MODEL)
    assert cache.put("img", torch.ones(SHAPE))
    assert cache.flush(10)
    assert _hit_tier(cache, "img") == "cpu"
    caplog.set_level(logging.WARNING, logger="lmcache_ec.purge.marker")
    watch = cache._purges.watch
    _plant(disk_dir, "default", *HOSTILE.values())
    _wait_for(lambda: watch.bad_records == len(HOSTILE), "the bad records read")
    assert _hit_tier(cache, "img") == "cpu"  # nothing purged, nothing raised
    # The log changes (a purge of another model): read again, the same bad records.
    append_disk(str(disk_dir), slug("default"), _line(model="org/another"))
    _wait_for(lambda: _purges_seen(cache) == 1, "the other model's purge")
    assert watch.bad_records == 2 * len(HOSTILE)
    assert _hit_tier(cache, "img") == "cpu"
    warned = [r for r in caplog.records if "bad record" in r.getMessage()]
    assert len(warned) == len(HOSTILE)  # each logged once
    append_disk(str(disk_dir), slug("default"), _line(model=MODEL))
    _wait_for(lambda: _hit_tier(cache, "img") != "cpu", "the valid purge applied")
    assert _purges_seen(cache) == 2


def test_a_hostile_log_never_breaks_start_up_or_the_scheduler(disk_dir, redis_url, make_cache):
    """A 5 KB nested record (and the rest) on disk and in Redis: the engine
    starts, the scheduler's lookups answer, and both watches keep running."""
    disk_dir.mkdir(exist_ok=True)
    _plant(disk_dir, "default", *HOSTILE.values())
    config = _config(disk_dir, remote_url=redis_url, remote_timeout=5)
    identity = EncoderIdentity(model=MODEL)
    with open_catalog(load_config(config)) as catalog:
        for line in HOSTILE.values():
            catalog.append_log(log_name("default"), line + b"\n", LOG_LIMIT)
    index = TierIndex(
        identity,
        disk_dir=str(disk_dir),
        open_catalog=lambda: open_catalog(load_config(config)),
        negative_ttl=0,
        purge_check_s=INTERVAL,
    )
    try:
        with make_cache(config, model=MODEL) as cache:
            assert cache.put("img", torch.ones(SHAPE))
            assert cache.flush(10)
            name = cache.key("img").mm_hash
            for _ in range(3):
                time.sleep(INTERVAL)
                assert index.lookup(name) == "disk"
            _wait_for(lambda: cache._purges.watch.remote_checked, "the remote log read")
            with open_catalog(load_config(config)) as catalog:
                append_remote(catalog, slug("default"), _line(model=MODEL))
            _wait_for(lambda: _purges_seen(cache) == 1, "the engine's watch applied it")
            _wait_for(lambda: index.purges_seen == 1, "the scheduler's watch applied it")
            # A remote record purges the engine's own disk too; the purger deletes the
            # remote entry itself (here only the record was written).
            assert _hit_tier(cache, "img") == "remote"
    finally:
        index.close()


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_only_a_regular_file_is_read_as_the_disk_log(disk_dir, tmp_path, kind, caplog, make_cache):
    disk_dir.mkdir(exist_ok=True)
    path = disk_path(str(disk_dir), "default")
    if kind == "fifo":
        os.mkfifo(path)  # an open for reading would wait for a writer forever
    else:
        target = tmp_path / "elsewhere"
        target.write_bytes(_line(model=MODEL))
        os.symlink(target, path)
    done = threading.Event()

    def start_and_read() -> None:
        with make_cache(_config(disk_dir), model=MODEL) as cache:
            assert cache.put("img", torch.ones(SHAPE))
            for _ in range(3):
                time.sleep(INTERVAL)
                assert _hit_tier(cache, "img") == "cpu"  # the link's record is not followed
        done.set()

    caplog.set_level(logging.WARNING, logger="lmcache_ec.purge.marker")
    thread = threading.Thread(target=start_and_read, daemon=True)
    thread.start()
    thread.join(30)  # a liveness bound, not a timing: a blocked open never returns
    assert done.is_set()
    assert len([r for r in caplog.records if "purge log" in r.getMessage()]) == 1


def test_the_watch_thread_survives_any_exception(disk_dir, redis_url, make_cache):
    config = _config(disk_dir, remote_url=redis_url, remote_timeout=5)
    cache = make_cache(config, model=MODEL)
    assert cache.put("img", torch.ones(SHAPE))
    assert cache.flush(10)
    watch = cache._purges.watch
    failures = []
    poll = watch.poll_disk

    def failing_poll(*args):
        if len(failures) < 3:
            failures.append(1)
            raise RuntimeError("a check went wrong")
        return poll(*args)

    watch.poll_disk = failing_poll
    _wait_for(lambda: len(failures) == 3, "three failed checks")
    with open_catalog(load_config(config)) as catalog:
        append_remote(catalog, slug("default"), _line(model=MODEL))
    _wait_for(lambda: _purges_seen(cache) == 1, "a purge applied after the failures")
    assert cache._purges._thread.is_alive()


# -- no purge lost, each within its own namespace -------------------------------


def test_two_tenants_purging_within_one_interval_are_both_applied(
    tmp_path,
    remote,
    make_cache,
):
    """Tenants a and b purge at once (a twice), all between two looks of the
    running engines at their logs; each applies its own namespace's purges,
    and tenant c's entries stay."""
    engines = {}
    tensors = {ns: make_tensor(SHAPE, torch.float32, seed=i) for i, ns in enumerate("abc")}
    for ns in "abc":
        disk = tmp_path / f"disk-{ns}"
        # One look at start, then only the looks this test makes: one interval.
        config = remote_config(**remote, local_disk=str(disk), purge_check_s=3600)
        engines[ns] = make_cache(config, model=MODEL, namespace=ns)
    catalog_config = load_config(remote_config(**remote))
    try:
        for cache in engines.values():
            assert cache.put("img", tensors[cache.identity.namespace])
            assert cache.flush(10)
            assert _hit_tier(cache, "img") == "cpu"
            _wait_for(lambda c=cache: c._purges.watch.remote_checked, "the first look")
        with open_catalog(catalog_config) as first, open_catalog(catalog_config) as second:
            appends = [
                (first, "a", _line(namespace="a", model=MODEL)),
                (second, "b", _line(namespace="b")),
                (first, "a", _line(namespace="a", weights="another-version")),
            ]
            with ThreadPoolExecutor(3) as pool:
                list(pool.map(lambda a: append_remote(a[0], slug(a[1]), a[2]), appends))
            for cache in engines.values():  # the next look of each engine
                cache._purges.watch.check_remote(first)
        assert [_purges_seen(engines[ns]) for ns in "abc"] == [2, 1, 0]
        for ns in "ab":
            # CPU copy dropped, the engine's own disk purged: the remote is untouched
            # here (the purger deletes it), so the read falls through to it.
            assert not any(n.endswith(".pt") for n in os.listdir(tmp_path / f"disk-{ns}"))
            assert _hit_tier(engines[ns], "img") == "remote"
        assert _hit_tier(engines["c"], "img") == "cpu"
        assert bit_equal(engines["c"].get("img"), tensors["c"])
    finally:
        for cache in engines.values():
            cache.close()


def test_a_generation_recorded_again_later_is_applied_again_and_counts_once(disk_dir, caplog):
    """``lmcache-ec purge`` records before and after its deletes (same
    generation, later time): a read between them may have cached an entry, so
    the later record is applied too; it is one purge seen, logged once."""
    applied: list[float] = []
    watch = MarkerWatch(str(disk_dir), "default", 1.0, lambda m, tier: applied.append(m.time))
    before = dataclasses.replace(PurgeMarker.new(Selector(model=MODEL)), time=time.time() - 5)
    after = dataclasses.replace(before, time=before.time + 1.0)  # times read as written
    assert not watch.poll_disk(now=9.0)  # no log yet: what comes next is news
    append_disk(str(disk_dir), slug("default"), before.to_line())
    with caplog.at_level(logging.INFO, logger="lmcache_ec.purge.marker"):
        assert watch.poll_disk(now=10.0)
        append_disk(str(disk_dir), slug("default"), after.to_line())
        append_disk(str(disk_dir), slug("default"), before.to_line())  # the older again: old news
        assert watch.poll_disk(now=11.0)
    assert applied == [before.time, after.time]
    assert [watch.counts(before.generation), watch.counts(after.generation)] == [True, False]
    assert len([r for r in caplog.records if "Purge" in r.getMessage()]) == 1


def test_a_record_selects_only_its_own_namespace(tmp_path, redis_url, make_cache):
    """Engines of two namespaces share one disk directory. An unscoped record in
    a's log purges a's entries only; one in a's log naming b is rejected."""
    disk = tmp_path / "shared-disk"
    config = _config(disk, remote_url=redis_url, remote_timeout=5)
    with (
        make_cache(config, model=MODEL, namespace="a") as a,
        make_cache(config, model=MODEL, namespace="b") as b,
    ):
        for cache in (a, b):
            assert cache.put("img", torch.ones(SHAPE))
            assert cache.flush(10)
            _wait_for(lambda c=cache: c._purges.watch.remote_checked, "first remote look")
        with open_catalog(load_config(config)) as catalog:
            bad = json.dumps({"v": 1, "generation": "ab", "time": time.time(), "select": {}})
            catalog.append_log(
                log_name("a"), bad.replace("{}", '{"namespace":"b"}').encode() + b"\n", LOG_LIMIT
            )
            _wait_for(lambda: a._purges.watch.bad_records >= 1, "the record naming b seen")
            assert _purges_seen(a) == _purges_seen(b) == 0
            append_remote(catalog, slug("a"), _line())  # unscoped, in a's log
        _wait_for(lambda: _purges_seen(a) == 1, "a's purge applied")
        names = {n.removesuffix(".pt") for n in os.listdir(disk) if n.endswith(".pt")}
        assert names == {b.key("img").storage_name}
        assert _hit_tier(b, "img") == "cpu" and _purges_seen(b) == 0


def test_a_purge_of_one_weights_version_keeps_the_others_cpu_entries(disk_dir, make_cache):
    disk_dir.mkdir(exist_ok=True)
    config = _config(disk_dir)
    with (
        make_cache(config, model=MODEL, weights="v1") as old,
        make_cache(config, model=MODEL, weights="v2") as new,
    ):
        for cache in (old, new):
            assert cache.put("img", torch.ones(SHAPE))
            assert cache.flush(10)
            assert _hit_tier(cache, "img") == "cpu"
        append_disk(str(disk_dir), slug("default"), _line(model=MODEL, weights="v1"))
        # Gone from the CPU tier (and from the disk, where the purger had left it).
        _wait_for(lambda: _hit_tier(old, "img") is None, "v1's copies dropped")
        _wait_for(lambda: _purges_seen(new) == 1, "v2's engine saw the purge")
        assert _hit_tier(new, "img") == "cpu"
