"""The scheduler's index over a Redis Cluster with one shard down: items on
the shards that answer are still found, without pausing lookups (docs:
"One shard down costs only the keys it owns")."""

from __future__ import annotations

import logging

from lmcache_ec.config import load_config
from lmcache_ec.integration.vllm import index as index_module
from lmcache_ec.integration.vllm.index import PENDING, TierIndex
from lmcache_ec.key import EncoderIdentity
from lmcache_ec.remote.catalog import open_catalog
from lmcache_ec.remote_names import redis_data_key
from tests.remote.conftest import outage_config

IDENTITY = EncoderIdentity(model="test/cluster-index")


def _answer(index: TierIndex, identifier: str) -> str | None:
    tier = index.lookup(identifier)
    if tier == PENDING:
        index.wait_answer(identifier, 10)
        tier = index.lookup(identifier)
    return tier


def test_one_shard_down_leaves_the_other_shards_items_found(redis_cluster, caplog):
    caplog.set_level(logging.WARNING, logger=index_module.__name__)
    config = load_config(outage_config(redis_cluster.url))
    items = [f"{i:064x}" for i in range(30)]
    with open_catalog(config) as catalog:
        for identifier in items:
            catalog.store.put(IDENTITY.storage_name(identifier), b"frame")
    owner = {i: redis_cluster.node_of(redis_data_key(IDENTITY.storage_name(i))) for i in items}
    victim = owner[items[0]]
    healthy = [i for i in items if owner[i] is not victim]
    assert 0 < len(healthy) < len(items)
    victim.kill()
    index = TierIndex(
        IDENTITY, disk_dir=None, open_catalog=lambda: open_catalog(config), negative_ttl=60
    )
    try:
        answers = {identifier: _answer(index, identifier) for identifier in items}
        assert {i for i, tier in answers.items() if tier == "remote"} == set(healthy)
        assert all(answers[i] is None for i in items if i not in healthy)  # a miss, at once
        assert index.remote_failures == 0
        assert not [r for r in caplog.records if "lookups paused" in r.getMessage()]
    finally:
        index.close()
