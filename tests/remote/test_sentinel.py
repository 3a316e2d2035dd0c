"""``redis-sentinel://`` (LMCache's spelling): the primary found through a real
``redis-server --sentinel``, entries shared by two instances."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

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


@pytest.fixture
def sentinel_url(redis_process, tmp_path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found on PATH (Debian package redis-server)")
    port = free_port()
    conf = tmp_path / "sentinel.conf"  # sentinel rewrites its file: a private copy
    conf.write_text(
        f"bind {HOST}\nport {port}\ndir {tmp_path}\nprotected-mode no\n"
        f"sentinel monitor {SERVICE} {HOST} {redis_process.port} 1\n"
    )
    proc = subprocess.Popen(
        [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
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
    remote_timeout — not redis-py's default of ten retries with backoff."""
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
    store = open_store(load_config(remote_config(url, remote_timeout=0.2)).remote)
    try:
        with pytest.raises(RedisError):
            store.get("anything")
        assert len(accepted) <= 2
    finally:
        store.close()
        listener.close()
        for connection in accepted:
            connection.close()
