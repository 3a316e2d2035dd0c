"""A program that exits without ``close()`` loses the writes still queued (the
tiers' writer threads are daemons): one warning at exit says how many. With
``close()`` they land, and nothing is said."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
import redis

from lmcache_ec.bench.proxy import SlowProxy

from .conftest import remote_config

_PUTS = """
import json, sys, torch
from lmcache_ec import ECCache
cache = ECCache.from_config(json.loads(sys.argv[1]), model="org/exit")
for i in range(8):
    assert cache.put(f"img-{i}", torch.full((4, 8), float(i)))
if sys.argv[2] == "close":
    cache.close()
"""


@pytest.fixture
def slow_redis(redis_url, redis_server):
    """The shared redis-server behind a proxy that holds each command 0.2 s."""
    proxy = SlowProxy(redis_server.port, 0.2)
    yield proxy
    proxy.close()


def _run(slow_redis, ending: str) -> str:
    config = json.dumps(remote_config(slow_redis.url, close_timeout=30))
    done = subprocess.run(
        [sys.executable, "-c", _PUTS, config, ending], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def _frames(redis_server) -> int:
    client: redis.Redis = redis_server.client()
    return len(list(client.scan_iter(match="ec1.*kv_bytes")))


def test_an_exit_without_close_says_how_many_writes_it_loses(slow_redis, redis_server):
    stderr = _run(slow_redis, "exit")
    (said,) = re.findall(r"Exiting with (\d+) accepted writes not yet on every tier", stderr)
    assert 1 <= int(said) <= 8
    time.sleep(1.0)  # what the proxy still held when the process died has landed
    assert _frames(redis_server) < 8  # and some writes never will


def test_close_writes_them_and_says_nothing(slow_redis, redis_server):
    stderr = _run(slow_redis, "close")
    assert "accepted writes" not in stderr
    assert _frames(redis_server) == 8
