"""Remote reads: frames read as bytes, private results, batched reads."""

from __future__ import annotations

import redis
import torch

from lmcache_ec import ECCache, codec
from lmcache_ec.bench.proxy import SlowProxy
from lmcache_ec.config import load_config
from lmcache_ec.remote.redis_store import MGET_BATCH
from lmcache_ec.remote.store import open_store
from lmcache_ec.remote_names import redis_data_key
from tests.conftest import bit_equal, make_tensor
from tests.remote.conftest import remote_config
from tests.servers import redis_commands

MODEL = "test/remote-reads"


def _stored(writer: ECCache, entries: dict[str, torch.Tensor]) -> None:
    """Store ``entries`` with ``writer``, then close it: the entries are remote only."""
    with writer:
        assert all(writer.put_many(entries))
        assert writer.flush(10)


def test_remote_results_are_private(remote, make_cache):
    tensor = make_tensor((16, 256), torch.bfloat16, seed=4)
    _stored(make_cache(remote_config(**remote), model=MODEL), {"x": tensor})
    for local_cpu in (False, True):
        config = remote_config(**remote, local_cpu=local_cpu)
        with make_cache(config, model=MODEL) as cache:
            first = cache.get("x")
            assert bit_equal(first, tensor)
            first.fill_(3.0)  # the caller owns what it got
            assert bit_equal(cache.get("x"), tensor)
            expected = {"remote": 1, "cpu": 1} if local_cpu else {"remote": 2}
            assert cache.stats.snapshot()["hits"] == expected


def test_get_many_fetches_remote_entries_in_one_request(redis_url, make_cache):
    entries = {f"img-{i}": make_tensor((8, 128), torch.float16, seed=i) for i in range(6)}
    _stored(make_cache(remote_config(redis_url), model=MODEL), entries)
    cache = make_cache(remote_config(redis_url), model=MODEL)
    assert bit_equal(cache.get("img-0"), entries["img-0"])  # now in the CPU tier
    store = cache._storage.storage_backends["RemoteBackend"].connection
    client = store.getWrappedConnector().store._client
    pipelines = []
    pipeline = client.pipeline
    client.pipeline = lambda *a, **k: pipelines.append(a) or pipeline(*a, **k)
    names = [*entries, "absent"]
    results, commands = redis_commands(redis_url, lambda: cache.get_many(names))
    data_keys = {redis_data_key(cache.key(name).storage_name) for name in names}
    reads = [c for c in commands if data_keys & set(c[1:])]
    # the purge watch's own reads of its log are not reads of entries
    assert {c[0].upper() for c in reads} == {"EXISTS", "GETRANGE"}  # bounded reads
    wanted = data_keys - {redis_data_key(cache.key("img-0").storage_name)}
    assert sorted(c[1] for c in reads if c[0].upper() == "GETRANGE") == sorted(wanted)
    assert len(pipelines) == 1  # one round trip for the batch
    assert results[-1] is None
    assert all(bit_equal(r, entries[n]) for n, r in zip(names, results[:-1], strict=False))
    hits = cache.stats.snapshot()["hits"]
    assert hits == {"remote": 6, "cpu": 1}


def test_get_many_with_duplicates_and_corrupt_entries(redis_url, make_cache):
    good = make_tensor((8, 128), torch.float32, seed=1)
    bad = make_tensor((8, 128), torch.float32, seed=2)
    _stored(make_cache(remote_config(redis_url), model=MODEL), {"good": good, "bad": bad})
    cache = make_cache(remote_config(redis_url), model=MODEL)
    client = redis.Redis.from_url(redis_url)
    data_key = redis_data_key(cache.key("bad").storage_name)
    client.set(data_key, client.get(data_key)[:-1])
    results = cache.get_many(["good", "bad", "good"])
    assert bit_equal(results[0], good) and bit_equal(results[2], good)
    assert results[1] is None
    assert cache.stats.snapshot()["integrity_failures"] == 1
    assert not client.exists(data_key)


def test_get_many_of_more_than_one_batch_hits_every_entry(redis_url, make_cache):
    """40 names span two pipelines (``MGET_BATCH``): each frame reaches its own key,
    through the cache and through the store alone (LMCache's remote backend asks
    the store for any number of keys at once)."""
    entries = {f"many-{i}": make_tensor((4 + i % 3, 32), torch.float16, seed=i) for i in range(40)}
    assert len(entries) > MGET_BATCH
    _stored(make_cache(remote_config(redis_url), model=MODEL), entries)
    cache = make_cache(remote_config(redis_url), model=MODEL)
    results = cache.get_many(list(entries))
    assert all(
        r is not None and bit_equal(r, entries[n]) for n, r in zip(entries, results, strict=True)
    )
    snapshot = cache.stats.snapshot()
    assert snapshot["integrity_failures"] == 0
    assert snapshot["hits"] == {"remote": 40}
    keys = [cache.key(name) for name in entries]
    store = open_store(load_config(remote_config(redis_url)).remote)
    try:
        frames = store.get_many([key.to_string() for key in keys])
    finally:
        store.close()
    for key, frame, tensor in zip(keys, frames, entries.values(), strict=True):
        assert frame is not None and bit_equal(codec.decode_bytes(frame, key).tensor, tensor)


def test_a_batch_longer_than_one_timeout_is_read_whole_from_a_healthy_slow_store(
    redis_server, redis_url, make_cache
):
    """Each request of a batch read has the whole-call bound, not the batch:
    a new connection (two round trips with redis-py's handshake) and four
    pipelines, each 0.5 s away, are 3.5 s, past one bound (2.5 s)."""
    entries = {f"far-{i}": make_tensor((4, 32), torch.float16, seed=i) for i in range(100)}
    assert len(entries) > 3 * MGET_BATCH
    _stored(make_cache(remote_config(redis_url), model=MODEL), entries)
    proxy = SlowProxy(redis_server.port, 0.5)
    try:
        far = {**remote_config(proxy.url), "remote_timeout": 2.0}
        cache = make_cache(far, model=MODEL)
        results = cache.get_many(list(entries))
        assert all(
            r is not None and bit_equal(r, entries[n])
            for n, r in zip(entries, results, strict=True)
        )
        remote = cache.stats.snapshot()["tiers"]["remote"]
        assert remote["available"] and remote.get("late_reads", 0) == 0
    finally:
        proxy.close()
