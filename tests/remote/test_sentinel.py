"""``redis-sentinel://`` (LMCache's spelling): the primary found through a real
``redis-server --sentinel``, entries shared by two instances."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from redis.exceptions import RedisError

from lmcache_ec.config import load_config
from lmcache_ec.remote.catalog import open_catalog
from lmcache_ec.remote.store import open_store
from tests.conftest import bit_equal, make_tensor
from tests.remote.conftest import frames_sent_in_place, remote_config
from tests.servers import HOST, _wait_for_port, free_port

MODEL = "test/sentinel-model"
SERVICE = "ec-primary"


def _redis_server() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found on PATH (Debian package redis-server)")
    return binary


def _start_sentinel(tmp_path, primary_port: int, settings: str = "") -> tuple[Any, int]:
    """A sentinel watching the primary on ``primary_port``: (its process, its port)."""
    port = free_port()
    conf = tmp_path / "sentinel.conf"  # sentinel rewrites its file: a private copy
    conf.write_text(
        f"bind {HOST}\nport {port}\ndir {tmp_path}\nprotected-mode no\n"
        f"sentinel monitor {SERVICE} {HOST} {primary_port} 1\n{settings}"
    )
    proc = subprocess.Popen(
        [_redis_server(), str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, port


@pytest.fixture
def sentinel_url(redis_process, tmp_path) -> Iterator[str]:
    proc, port = _start_sentinel(tmp_path, redis_process.port)
    try:
        _wait_for_port(port)
        import redis

        client = redis.Redis(host=HOST, port=port, socket_timeout=5)
        deadline = time.monotonic() + 20
        while client.sentinel_get_master_addr_by_name(SERVICE) is None:
            assert time.monotonic() < deadline, "sentinel never learned the primary"
            time.sleep(0.05)
        yield f"redis-sentinel://{HOST}:{port}/{SERVICE}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_two_instances_share_entries_through_sentinel(sentinel_url, redis_process, make_cache):
    config = remote_config(sentinel_url)
    tensors = {f"s{i}": make_tensor((3, 16), torch.bfloat16, seed=i) for i in range(4)}
    with make_cache(config, model=MODEL) as writer, frames_sent_in_place() as sent:
        assert all(writer.put_many(tensors))
        assert writer.flush(10)
        names = {writer.key(h).storage_name for h in tensors}
    assert len(sent) == len(tensors)  # sent from the pool buffers
    with make_cache(config, model=MODEL) as reader:
        got = reader.get_many(list(tensors))
        assert all(
            t is not None and bit_equal(t, tensors[h]) for h, t in zip(tensors, got, strict=True)
        )
    # The entries are on the primary Sentinel names, under LMCache's key naming.
    assert {k.decode() for k in redis_process.client().keys("*kv_bytes")} == {
        name + "kv_bytes" for name in names
    }
    with open_catalog(load_config(config)) as catalog:
        assert {name for name, _ in catalog.list()} == names


def test_a_sentinel_that_never_answers_is_asked_once_a_discovery(tmp_path):
    """A hung sentinel (it accepts, never replies): a read gives up after one
    attempt per discovery (the client's one retry makes two), each bounded by
    remote_timeout — not redis-py's default of ten retries with backoff. (The
    primary watch's first look at open is one more connection.)"""
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen(64)
    accepted: list[socket.socket] = []

    def accept_and_stay_silent() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept_and_stay_silent, daemon=True).start()
    url = f"redis-sentinel://{HOST}:{listener.getsockname()[1]}/{SERVICE}"
    config = remote_config(url, remote_timeout=0.2, remote_retry_interval=60)  # watch: one look
    store = open_store(load_config(config).remote)
    try:
        with pytest.raises(RedisError):
            store.get("anything")
        assert len(accepted) <= 3
    finally:
        store.close()
        listener.close()
        for connection in accepted:
            connection.close()


@pytest.fixture
def failover(redis_process, tmp_path) -> Iterator[tuple[str, object, Callable[[], None]]]:
    """A primary, its replica and a sentinel: (url, replica's client, fail over)."""
    import redis

    redis_process.client().config_set("repl-diskless-sync-delay", 0)
    replica_port = free_port()
    replica = subprocess.Popen(
        [
            *(_redis_server(), "--bind", HOST, "--port", str(replica_port), "--dir", str(tmp_path)),
            *("--save", "", "--appendonly", "no", "--protected-mode", "no"),
            *("--replicaof", HOST, str(redis_process.port)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    settings = f"sentinel failover-timeout {SERVICE} 5000\n"
    sentinel, sentinel_port = _start_sentinel(tmp_path, redis_process.port, settings)
    try:
        _wait_for_port(replica_port)
        _wait_for_port(sentinel_port)
        replica_client = redis.Redis(host=HOST, port=replica_port, socket_timeout=5)
        sentinel_client = redis.Redis(host=HOST, port=sentinel_port, socket_timeout=5)
        deadline = time.monotonic() + 30
        while not sentinel_client.execute_command("SENTINEL", "REPLICAS", SERVICE) or (
            replica_client.info("replication").get("master_link_status") != "up"
        ):
            assert time.monotonic() < deadline, "the sentinel never saw a synced replica"
            time.sleep(0.1)

        def fail_over() -> None:
            deadline = time.monotonic() + 30
            while True:  # NOGOODSLAVE until the sentinel has looked at the replica
                try:
                    sentinel_client.execute_command("SENTINEL", "FAILOVER", SERVICE)
                    break
                except redis.ResponseError as exc:
                    assert time.monotonic() < deadline, f"no failover: {exc}"
                    time.sleep(0.2)
            while sentinel_client.sentinel_get_master_addr_by_name(SERVICE)[1] != replica_port:
                assert time.monotonic() < deadline, "the failover never happened"
                time.sleep(0.05)

        yield f"redis-sentinel://{HOST}:{sentinel_port}/{SERVICE}", replica_client, fail_over
    finally:
        for proc in (sentinel, replica):
            proc.kill()
            proc.wait(timeout=10)


def test_after_a_planned_failover_writes_go_to_the_new_primary(failover, make_cache, caplog):
    """redis-py asks the sentinels only for new connections: without the watch, the
    pooled ones kept writing to the old primary, which drops them as it turns
    replica (for about 10 s here)."""
    url, new_primary, fail_over = failover
    config = remote_config(url, remote_retry_interval=0.2)
    with make_cache(config, model=MODEL) as cache:
        assert cache.put("before", make_tensor((3, 16), torch.bfloat16, seed=1))
        assert cache.flush(10)
        fail_over()
        time.sleep(1.0)  # several of the watch's looks
        assert cache.put("after", make_tensor((3, 16), torch.bfloat16, seed=2))
        assert cache.flush(10)
        name = cache.key("after").storage_name + "kv_bytes"
    assert new_primary.exists(name)
    moved = [r.getMessage() for r in caplog.records if "the primary of" in r.getMessage()]
    assert len(moved) == 1 and SERVICE in moved[0]


def test_redis_py_sentinel_pool_parts_the_primary_watch_uses():
    """sentinel_watch.PrimaryWatch reads a redis-py SentinelConnectionPool's
    ``sentinel_manager`` and ``service_name`` and calls ``disconnect()``."""
    from redis.sentinel import Sentinel

    pool = Sentinel([(HOST, free_port())]).master_for(SERVICE).connection_pool
    assert pool.service_name == SERVICE
    assert callable(pool.sentinel_manager.discover_master) and callable(pool.disconnect)
