"""A purge on a Redis primary with replicas says whether they hold its deletes.

Redis replicates asynchronously: a delete the primary acknowledged may not
have reached a replica yet, and a failover to that replica serves the purged
entries again. So a purge ends by waiting (``WAIT``, half of
``remote_timeout``) for every connected replica, and warns and exits 1 when
one did not confirm. Real ``redis-server``s: a primary and one replica, the
replica stopped (SIGSTOP) to stand for one that lags.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis

from lmcache_ec.config import load_config
from lmcache_ec.remote.catalog import open_catalog
from lmcache_ec.remote.redis_store import RedisStore
from lmcache_ec.remote.store import Replication
from tests.cli.conftest import invoke, populate, runner, write_config
from tests.servers import free_port

__all__ = ["invoke", "runner"]  # CLI fixtures, used by name

MODEL = "org/replicated"


def _frames(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter(match="ec1.*kv_bytes"))


@pytest.fixture
def replica(redis_process, tmp_path) -> Iterator[subprocess.Popen]:
    """A replica of ``redis_process``, in sync when the test starts."""
    redis_process.client().config_set("repl-diskless-sync-delay", 0)  # sync at once, not in 5 s
    port = free_port()
    proc = subprocess.Popen(
        [
            shutil.which("redis-server"),
            *("--bind", "127.0.0.1", "--port", str(port), "--dir", str(tmp_path)),
            *("--save", "", "--appendonly", "no", "--protected-mode", "no"),
            *("--replicaof", "127.0.0.1", str(redis_process.port)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc.client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if proc.client.info("replication").get("master_link_status") == "up":
                    break
            except redis.exceptions.ConnectionError:
                pass
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=10)


def _config(tmp_path, url: str, remote_timeout: float = 1.0) -> str:
    return write_config(
        tmp_path / "ec.yaml",
        local_cpu=True,
        max_local_cpu_size=0.0625,
        remote_url=url,
        remote_timeout=remote_timeout,
    )


def test_a_purge_returns_once_the_replicas_hold_its_deletes(
    tmp_path, redis_process, replica, invoke
):
    # The wait ends once the replica confirms: a long bound for a loaded machine.
    config = _config(tmp_path, redis_process.url, remote_timeout=10.0)
    populate(config, MODEL, "default", 3)
    said = " ".join(invoke("purge", "--config", config, "--model", MODEL).output.split())
    assert "remote: deleted 3 entries" in said and "replicas" not in said
    assert _frames(replica.client) == []  # confirmed: the replica has them gone already


def test_a_purge_a_replica_has_not_confirmed_warns_and_exits_1(
    tmp_path, redis_process, replica, invoke
):
    config = _config(tmp_path, redis_process.url)
    populate(config, MODEL, "default", 3)
    os.kill(replica.pid, signal.SIGSTOP)  # connected, but confirms nothing
    said = " ".join(invoke("purge", "--config", config, "--model", MODEL, expect=1).output.split())
    assert "remote: deleted 3 entries" in said
    assert "0 of 1 replicas confirmed the purge within 0.5s" in said
    assert "run the purge again" in said and "Traceback" not in said


def test_the_wait_covers_deletes_made_on_other_connections(redis_process, replica):
    """Deletes sent on another connection than the check's are waited for too
    (WAIT counts from the offset its own connection last saw: the check makes
    a write of its own first, for releases that count only a connection's writes)."""
    other = redis_process.client()
    other.set("ec1.elsewhere", b"x")
    own = redis.Redis(host="127.0.0.1", port=redis_process.port, single_connection_client=True)
    store = RedisStore(own, 1.0, "primary", 1 << 20)
    store.append_log("ec-test.log", b"a write of this connection\n", 4096)
    # WAIT answers once the replica acknowledges: a long bound costs nothing
    # then, and a loaded machine's replica still makes it.
    assert store.replicate(10.0) == Replication(acked=1, replicas=1)
    os.kill(replica.pid, signal.SIGSTOP)
    other.delete("ec1.elsewhere")
    assert store.replicate(0.5) == Replication(acked=0, replicas=1)
    os.kill(replica.pid, signal.SIGCONT)
    assert store.replicate(10.0) == Replication(acked=1, replicas=1)
    store.close()


def test_a_store_without_replicas_waits_for_nothing(redis_process):
    settings = {"remote_url": redis_process.url, "remote_timeout": 1.0}
    with open_catalog(load_config(settings)) as catalog:
        assert catalog.replicate() is None
