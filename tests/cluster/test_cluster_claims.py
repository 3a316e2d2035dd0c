"""Claims on a Redis Cluster: each name on the shard owning its slot."""

from __future__ import annotations

import time

import pytest

from tests.remote.conftest import open_stores


@pytest.mark.parametrize("ttl", [0.001, 3600.0])
def test_cluster_claims(redis_cluster, ttl):
    first, second = open_stores(redis_cluster.url)
    try:
        names = [f"ec-claim.spread-{i}" for i in range(12)]  # over every shard
        assert all(first.claim(name, ttl) for name in names)
        if ttl > 1:
            assert not any(second.claim(name, ttl) for name in names)
            assert all(first.claim(name, ttl) for name in names)  # already ours
            for name in names:
                second.release(name)  # not its claims: left alone
            assert not any(second.claim(name, ttl) for name in names)
            for name in names:
                first.release(name)
        else:
            time.sleep(0.05)
            assert all(second.claim(name, 30) for name in names)
            for name in names:
                first.release(name)  # a slow holder's late release: not its claims now
            assert not any(first.claim(name, 30) for name in names)
            for name in names:
                second.release(name)
        assert all(first.claim(name, 30) for name in names)
    finally:
        first.close()
        second.close()
