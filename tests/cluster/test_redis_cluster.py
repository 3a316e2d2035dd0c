"""The remote tier on a real Redis Cluster: sharing, and one shard's outage.

``redis-cluster://host1:port1,…`` (LMCache's spelling) goes through redis-py's
cluster client for the slot map; a shard that is down costs only the keys it
owns: they miss cleanly, the other shards' keys still hit, nothing waits past
``remote_timeout``, and the shard is used again once it is back.
"""

from __future__ import annotations

import time

import torch

from lmcache_ec import ECCache
from lmcache_ec.config import load_config
from lmcache_ec.remote.catalog import open_catalog
from lmcache_ec.remote_names import redis_data_key, redis_meta_key
from tests.conftest import bit_equal, make_tensor
from tests.remote.conftest import (
    RETRY,
    TIMEOUT,
    frames_sent_in_place,
    outage_config,
    remote_config,
)

MODEL = "test/cluster-model"
BOUND = TIMEOUT + 1.5  # remote_timeout plus scheduling slack on a loaded machine


def _tensors(prefix: str, count: int) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}-{i}": make_tensor((4 + i % 3, 32), torch.float16, seed=i) for i in range(count)
    }


def _remote(cache: ECCache):
    return cache._storage.storage_backends["RemoteBackend"]


def test_two_instances_share_entries_through_the_cluster(redis_cluster, make_cache):
    config = remote_config(redis_cluster.url)
    tensors = _tensors("shared", 24)
    with make_cache(config, model=MODEL) as writer, frames_sent_in_place() as sent:
        assert all(writer.put_many(tensors))
        assert writer.flush(10)
        names = {mm_hash: writer.key(mm_hash).storage_name for mm_hash in tensors}
    assert len(sent) == len(tensors)  # every frame sent from its pool buffer, on every shard
    owners = {redis_cluster.node_of(redis_data_key(name)).port for name in names.values()}
    assert len(owners) == 3  # the entries are spread over every shard

    with make_cache(config, model=MODEL) as reader:
        got = reader.get_many(list(tensors))
        assert all(
            t is not None and bit_equal(t, tensors[h]) for h, t in zip(tensors, got, strict=True)
        )
        assert _remote(reader).snapshot()["available"]

    with open_catalog(load_config(config)) as catalog:
        assert dict(catalog.list()).keys() == set(names.values())
        assert catalog.lookup_many([*names.values(), "ec1.x.y." + "0" * 64]) == [True] * 24 + [
            False
        ]
        header = catalog.read_header(names["shared-0"])
        assert header is not None and header["mm_hash"] == "shared-0"
        catalog.store.abort()  # what a late read does: every shard's connections cut
        header = catalog.read_header(names["shared-1"])  # and the next call connects again
        assert header is not None and header["mm_hash"] == "shared-1"
        assert catalog.delete(names["shared-0"])
        assert not catalog.exists(names["shared-0"])


def test_a_key_of_another_type_is_listed_as_one_damaged_entry(redis_cluster, make_cache):
    config = remote_config(redis_cluster.url)
    tensors = _tensors("listed", 6)
    with make_cache(config, model=MODEL) as writer:
        assert all(writer.put_many(tensors))
        assert writer.flush(10)
        damaged = writer.key("damaged").storage_name
    data_key = redis_data_key(damaged)
    redis_cluster.node_of(data_key).client().rpush(data_key, b"not a frame")
    meta_key = redis_meta_key(damaged)
    redis_cluster.node_of(meta_key).client().set(meta_key, b"x")
    with open_catalog(load_config(config)) as catalog:
        listed = dict(catalog.list())
    assert len(listed) == len(tensors) + 1 and listed[damaged] == 0


def test_get_many_of_many_entries_hits_every_one(redis_cluster, make_cache):
    """40 names grouped by shard, one pipeline each: each frame reaches its own key."""
    config = remote_config(redis_cluster.url)
    tensors = _tensors("many", 40)
    with make_cache(config, model=MODEL) as writer:
        assert all(writer.put_many(tensors))
        assert writer.flush(10)
    reader = make_cache(config, model=MODEL)
    got = reader.get_many(list(tensors))
    assert all(
        t is not None and bit_equal(t, tensors[h]) for h, t in zip(tensors, got, strict=True)
    )
    snapshot = reader.stats.snapshot()
    assert snapshot["integrity_failures"] == 0
    assert snapshot["hits"] == {"remote": 40}


def test_one_shard_down_costs_only_its_keys(redis_cluster, make_cache):
    config = outage_config(redis_cluster.url)
    tensors = _tensors("before", 24)
    with make_cache(config, model=MODEL) as writer:
        assert all(writer.put_many(tensors))
        assert writer.flush(10)
        names = {mm_hash: writer.key(mm_hash).storage_name for mm_hash in tensors}
    owner = {h: redis_cluster.node_of(redis_data_key(names[h])) for h in tensors}
    victim = owner["before-0"]
    lost = {h for h in tensors if owner[h] is victim}
    assert 0 < len(lost) < len(tensors)

    reader = make_cache(config, model=MODEL)
    victim.kill()
    got = reader.get_many(list(tensors))
    for mm_hash, tensor in zip(tensors, got, strict=True):
        if mm_hash in lost:
            assert tensor is None
        else:
            assert tensor is not None and bit_equal(tensor, tensors[mm_hash])
    for mm_hash in sorted(lost)[:3]:
        started = time.monotonic()
        assert reader.get(mm_hash) is None
        assert reader.contains(mm_hash) is None
        assert time.monotonic() - started < 2 * BOUND
    remote = _remote(reader)
    assert remote.available  # one shard down is not the tier down

    fresh = _tensors("during", 12)
    started = time.monotonic()
    assert all(reader.put(h, t) for h, t in fresh.items())
    assert time.monotonic() - started < BOUND  # put never waits on the dead shard
    assert reader.flush(10)
    for mm_hash in fresh:
        name = reader.key(mm_hash).storage_name
        node = redis_cluster.node_of(redis_data_key(name))
        if node is not victim:
            assert node.client().exists(redis_data_key(name))
    assert remote.snapshot()["shard_misses"] > 0

    # The shard returns (empty: no persistence): this same instance writes to it again.
    victim.start()
    redis_cluster.wait_ok()
    time.sleep(RETRY)
    landed = False
    deadline = time.monotonic() + 20
    attempt = 0
    while not landed and time.monotonic() < deadline:
        attempt += 1
        mm_hash = f"after-{attempt}"
        name = reader.key(mm_hash).storage_name
        if redis_cluster.node_of(redis_data_key(name)) is not victim:
            continue
        assert reader.put(mm_hash, make_tensor((2, 32), torch.float16, seed=attempt))
        assert reader.flush(10)
        landed = bool(victim.client().exists(redis_data_key(name)))
        if not landed:
            time.sleep(RETRY)
    assert landed
    assert remote.available
    # What this instance wrote while the shard was down is re-sent to it.
    owed = [
        redis_data_key(reader.key(h).storage_name)
        for h in fresh
        if redis_cluster.node_of(redis_data_key(reader.key(h).storage_name)) is victim
    ]
    assert owed
    deadline = time.monotonic() + 20
    while not all(victim.client().exists(key) for key in owed):
        assert time.monotonic() < deadline, "writes missed by the shard were not re-sent"
        time.sleep(0.1)


def test_every_shard_down_is_the_tier_down_until_one_returns(redis_cluster, make_cache):
    config = outage_config(redis_cluster.url)
    tensors = _tensors("all", 6)
    with make_cache(config, model=MODEL) as writer:
        assert all(writer.put_many(tensors))
        assert writer.flush(10)
    reader = make_cache(config, model=MODEL)
    remote = _remote(reader)
    for node in redis_cluster.nodes:
        node.kill()
    for mm_hash in tensors:
        started = time.monotonic()
        assert reader.get(mm_hash) is None
        assert time.monotonic() - started < BOUND
    assert reader.get_many(list(tensors)) == [None] * len(tensors)
    assert not remote.available  # no primary answers: the tier is unavailable
    for node in redis_cluster.nodes:
        node.start()
    redis_cluster.wait_ok()
    deadline = time.monotonic() + 20
    while not remote.available:
        assert time.monotonic() < deadline, "the tier did not come back with its shards"
        time.sleep(RETRY)
    # Restarted empty (no persistence): a write goes through again.
    assert reader.put("all-new", make_tensor((2, 32), torch.float16))
    assert reader.flush(10)
    name = reader.key("all-new").storage_name
    assert redis_cluster.node_of(redis_data_key(name)).client().exists(redis_data_key(name))
