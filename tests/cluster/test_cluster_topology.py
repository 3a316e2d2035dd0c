"""The remote tier follows a Redis Cluster whose topology changes or breaks.

A slot moved to another primary (``MOVED``) or being moved (``ASK``) is read
and written where its keys are now, never an outage; the slot map is then
asked for again. After a primary fails over to its replica, its keys are served
by the new primary without a restart, and what was written meanwhile is
re-sent. A hung node (accepting, never answering) costs nothing while another
answers: a fresh store builds its slot map, and the health probe brings the
tier back, through the other nodes. A node's integer answer to a range read is
a damaged value, never an allocation of that size.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import torch
from redis.exceptions import ClusterDownError

from lmcache_ec.config import load_config
from lmcache_ec.remote.redis_cluster import RedisClusterStore
from lmcache_ec.remote.store import ShardUnavailable, StoreError, open_store
from lmcache_ec.remote_names import redis_data_key
from tests.cluster.conftest import ClusterNode, RedisCluster
from tests.conftest import make_tensor
from tests.remote.conftest import RETRY, TIMEOUT, outage_config, redis_requests, remote_config
from tests.servers import HOST, BlackHole, Drip

MODEL = "test/cluster-model"
LIVENESS = 20.0  # only ever reached when the behaviour is missing: never a timing bound


def _store(url: str, **config: float) -> RedisClusterStore:
    store = open_store(load_config(remote_config(url, **config)).remote)
    assert isinstance(store, RedisClusterStore)
    return store


def _name(i: int) -> str:
    return f"ec1.ns.m.{i:064x}"


def _names_in_slot(cluster: RedisCluster, slot: int, count: int) -> list[str]:
    """``count`` names (none of ``_name(0…999)``) whose data keys are in ``slot``."""
    found = (_name(i) for i in range(1000, 1 << 20))
    names = [name for name in found if cluster.slot_of(redis_data_key(name)) == slot]
    assert len(names) >= count
    return names[:count]


def _other_primary(cluster: RedisCluster, node: ClusterNode) -> ClusterNode:
    return next(other for other in cluster.primaries if other is not node)


def _asking(node: ClusterNode, *command: object) -> object:
    """``command``'s reply from a node importing its key's slot."""
    pipe = node.client().pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.execute_command(*command)
    return pipe.execute()[1]


def _until(check, what: str) -> None:
    deadline = time.monotonic() + LIVENESS
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def store(redis_cluster: RedisCluster) -> Iterator[RedisClusterStore]:
    store = _store(redis_cluster.url)
    try:
        yield store
    finally:
        store.close()


def test_a_key_whose_slot_moved_is_read_and_written_at_its_new_primary(redis_cluster, store):
    names = [_name(i) for i in range(12)]
    for name in names:
        store.put(name, name.encode())
    moving = names[0]
    key = redis_data_key(moving)
    slot = redis_cluster.slot_of(key)
    target = _other_primary(redis_cluster, redis_cluster.owner(slot))
    redis_cluster.move_slot(slot, target)  # the store's map still has the old owner

    assert store.get(moving) == moving.encode()  # MOVED: asked again at the new owner
    assert store.exists(moving)
    assert store.read_range(moving, 4, 4) == moving.encode()[4:8]
    assert store.get_many(names) == [name.encode() for name in names]
    assert store.exists_many(names) == [True] * len(names)
    store.put(moving, b"rewritten")
    assert target.client().get(key) == b"rewritten"  # written where the slot is now

    def straight_to_the_new_owner() -> bool:  # the slot map was asked for again
        with redis_requests() as sent:
            assert store.get(moving) == b"rewritten"
        return len(sent) == 1

    _until(straight_to_the_new_owner, "the slot map was never refreshed after MOVED")


def test_a_key_of_a_slot_being_moved_is_asked_for_where_it_went(redis_cluster, store):
    others = [_name(i) for i in range(12)]
    for name in others:
        store.put(name, name.encode())
    slot = redis_cluster.slot_of(redis_data_key(others[0]))
    gone, staying, new = _names_in_slot(redis_cluster, slot, 3)
    store.put(gone, b"gone")
    store.put(staying, b"staying")
    target = _other_primary(redis_cluster, redis_cluster.owner(slot))
    source = redis_cluster.begin_moving(slot, target)
    redis_cluster.migrate(source, target, [redis_data_key(gone)])

    assert store.get(gone) == b"gone"  # ASK: read on the importing node after ASKING
    assert store.get(staying) == b"staying"  # not moved yet: still read at its owner
    store.put(new, b"new")  # a new key of the slot lands on the importing node
    assert _asking(target, "GET", redis_data_key(new)) == b"new"
    assert store.exists(new) and store.read_range(new, 1, 2) == b"ew"
    names = [gone, staying, new, *others]
    assert store.get_many(names) == [b"gone", b"staying", b"new"] + [n.encode() for n in others]
    assert store.exists_many(names) == [True] * len(names)


def test_a_listing_while_a_slot_is_being_moved_fails_rather_than_miss_entries(redis_cluster, store):
    """Keys of a moving slot are on two primaries: a scan of one, then the other,
    can miss a key or see it twice. ``ls``/``purge`` must not take that as whole."""
    names = [_name(i) for i in range(12)]
    for name in names:
        store.put(name, name.encode())
    assert sorted(n for n, _ in store.list()) == sorted(names)
    slot = redis_cluster.slot_of(redis_data_key(names[0]))
    redis_cluster.begin_moving(slot, _other_primary(redis_cluster, redis_cluster.owner(slot)))
    with pytest.raises(ShardUnavailable, match="being moved"):
        list(store.list())


def test_a_slot_moved_during_a_listing_fails_it(redis_cluster, store, monkeypatch):
    """A key moved from a primary not yet scanned to one already scanned would be
    missed (a purge would leave it, served): the slots are compared around the scan."""
    import lmcache_ec.remote.redis_cluster as cluster_module

    names = [_name(i) for i in range(40)]
    for name in names:
        store.put(name, name.encode())
    first, *rest = redis_cluster.primaries
    later = next(n for n in names if redis_cluster.node_of(redis_data_key(n)) in rest)
    scan = cluster_module._scan
    scanned: list[int] = []

    def scan_then_move(client, prefix):
        batches = list(scan(client, prefix))
        if not scanned:  # after the first primary: the slot goes where the scan has been
            redis_cluster.move_slot(redis_cluster.slot_of(redis_data_key(later)), first)
        scanned.append(1)
        return iter(batches)

    monkeypatch.setattr(cluster_module, "_scan", scan_then_move)
    with pytest.raises(ShardUnavailable, match="moved during the listing"):
        list(store.list())


def test_a_node_answering_clusterdown_is_its_shard_down_not_the_tier(
    redis_cluster, store, monkeypatch, caplog
):
    """A restarted primary answers ``CLUSTERDOWN`` until the cluster takes it back:
    its keys miss, the other shards keep hitting, and it is not "available again"
    until it serves."""
    caplog.set_level(logging.WARNING, logger="lmcache_ec.remote.redis_cluster")
    names = [_name(i) for i in range(24)]
    for name in names:
        store.put(name, name.encode())
    rejoining = redis_cluster.primaries[0]
    mine = [n for n in names if redis_cluster.node_of(redis_data_key(n)) is rejoining]
    others = [n for n in names if n not in mine]
    node = next(n for n in store._primaries() if n.port == rejoining.port)
    client = store._client_of(node)
    pipeline = client.pipeline

    def refusing_pipeline(*args, **kwargs):
        pipe = pipeline(*args, **kwargs)

        def execute(raise_on_error=True):
            count = len(pipe.command_stack)
            pipe.reset()
            return [ClusterDownError("The cluster is down")] * count

        pipe.execute = execute
        return pipe

    monkeypatch.setattr(client, "pipeline", refusing_pipeline)
    with pytest.raises(ShardUnavailable):
        store.get(mine[0])
    assert store.get_many(others) == [name.encode() for name in others]
    time.sleep(RETRY + 0.1)  # tried again: still refusing, so not back
    assert store.get_many(mine) == [None] * len(mine)
    said = [r.getMessage() for r in caplog.records]
    assert sum("unavailable" in line for line in said) == 1
    assert not any("available again" in line for line in said)
    monkeypatch.undo()
    _until(lambda: _answers(store, mine[0]), "the shard did not come back once it served")
    assert any("available again" in r.getMessage() for r in caplog.records)


def test_a_hung_shard_holds_no_caller_after_its_first_failure(redis_cluster, monkeypatch, caplog):
    """Once a shard failed, callers skip it; after each retry interval one ping
    in the background tries it, never every caller (each would wait out the
    timeout: a hung shard cost every thread of a busy tier half its time)."""
    caplog.set_level(logging.WARNING, logger="lmcache_ec.remote.redis_cluster")
    store = _store(redis_cluster.url, remote_timeout=TIMEOUT, remote_retry_interval=RETRY)
    names = [_name(i) for i in range(24)]
    for name in names:
        store.put(name, name.encode())
    hung = redis_cluster.node_of(redis_data_key(names[0]))
    mine = [n for n in names if redis_cluster.node_of(redis_data_key(n)) is hung]
    client = store._client_of(next(n for n in store._primaries() if n.port == hung.port))
    sent: list[int] = []
    pipeline = client.pipeline
    monkeypatch.setattr(client, "pipeline", lambda *a, **k: sent.append(1) or pipeline(*a, **k))
    os.kill(hung.proc.pid, signal.SIGSTOP)  # accepts connections, never answers
    try:
        with pytest.raises(ShardUnavailable):
            store.get(mine[0])  # the failure that marks it down
        time.sleep(RETRY + 0.1)  # due to be tried again
        sent.clear()
        failures: list[BaseException] = []

        def caller(name: str) -> None:
            try:
                store.get(name)
            except ShardUnavailable as exc:
                failures.append(exc)

        threads = [threading.Thread(target=caller, args=(n,)) for n in mine * 2]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(LIVENESS)
        assert len(failures) == len(threads)
        assert sent == []  # no caller went to the hung shard: its ping did
    finally:
        os.kill(hung.proc.pid, signal.SIGCONT)
    try:
        _until(lambda: _answers(store, mine[0]), "the shard was not tried again once it answered")
        said = [r.getMessage() for r in caplog.records]
        assert sum("unavailable" in line for line in said) == 1
        assert sum("available again" in line for line in said) == 1
    finally:
        store.close()


def _answers(store: RedisClusterStore, name: str) -> bool:
    try:
        return store.get(name) == name.encode()
    except ShardUnavailable:
        return False


def test_after_a_failover_the_shards_keys_are_served_by_its_new_primary(
    redis_cluster_with_replicas,
):
    cluster = redis_cluster_with_replicas
    store = _store(cluster.url, remote_timeout=TIMEOUT, remote_retry_interval=RETRY)
    shard_back = threading.Event()
    store.on_shard_back = shard_back.set
    try:
        names = [_name(i) for i in range(24)]
        for name in names:
            store.put(name, name.encode())
        victim = cluster.node_of(redis_data_key(names[0]))
        lost = [name for name in names if cluster.node_of(redis_data_key(name)) is victim]
        assert victim.client().execute_command("WAIT", 1, 10_000) == 1  # its replica has them
        victim.kill()

        def served() -> bool:
            try:
                return store.get(lost[0]) == lost[0].encode()
            except ShardUnavailable:
                return False  # until the replica takes over and the map says so

        _until(served, "the shard's keys were never served by its new primary")
        assert store.get_many(lost) == [name.encode() for name in lost]
        store.put(lost[1], b"after")
        new_primary = cluster.node_of(redis_data_key(lost[1]))
        assert new_primary is not victim
        assert new_primary.client().get(redis_data_key(lost[1])) == b"after"
        assert shard_back.is_set()  # what was written meanwhile is re-sent
        assert victim.port not in {int(name.rsplit(":", 1)[1]) for name in store._clients}
    finally:
        store.close()


@pytest.fixture
def hung_nodes() -> Iterator[list[BlackHole]]:
    holes = [BlackHole() for _ in range(3)]
    try:
        yield holes
    finally:
        for hole in holes:
            hole.close()


def test_a_fresh_store_builds_its_slot_map_while_startup_nodes_hang(redis_cluster, hung_nodes):
    live = redis_cluster.nodes[0]
    addresses = [f"{HOST}:{hole.port}" for hole in hung_nodes] + [f"{HOST}:{live.port}"]
    # A timeout far past the test: a node that hangs must cost nothing at all.
    store = _store("redis-cluster://" + ",".join(addresses), remote_timeout=60.0)
    written = threading.Event()

    def first_call() -> None:
        store.put(_name(1), b"one")
        written.set()

    threading.Thread(target=first_call, daemon=True).start()
    try:
        # Every startup node is asked at once: none waits for another to time out.
        _until(lambda: all(hole.accepted for hole in hung_nodes), "startup nodes asked in turn")
        _until(written.is_set, "no slot map from the node that answers")
        assert store.get(_name(1)) == b"one"
    finally:
        store.close()


def test_a_hung_primary_never_keeps_the_tier_down(redis_cluster, make_cache):
    config = outage_config(redis_cluster.url)
    tensors = {f"hung-{i}": make_tensor((4, 32), torch.float16, seed=i) for i in range(12)}
    with make_cache(config, model=MODEL) as writer:
        assert all(writer.put_many(tensors))
        assert writer.flush(10)
        owners = {
            h: redis_cluster.node_of(redis_data_key(writer.key(h).storage_name)) for h in tensors
        }
    # The first two primaries of every client's map: pinged in turn, they would
    # cost twice the probe's bound (one alone could time out just inside it).
    hung = redis_cluster.primaries[:2]
    healthy = [h for h in tensors if owners[h] not in hung]
    assert healthy
    for node in hung:
        os.kill(node.proc.pid, signal.SIGSTOP)  # accepts connections, never answers
    try:
        reader = make_cache(config, model=MODEL)
        remote = reader._storage.storage_backends["RemoteBackend"]
        remote.health.failed("get", StoreError("marked down by the test"))

        def hits() -> bool:  # the probe brought the tier back: healthy shards hit
            return remote.available and reader.get(healthy[0]) is not None

        _until(hits, "hung primaries kept the whole tier down")
    finally:
        for node in hung:
            os.kill(node.proc.pid, signal.SIGCONT)


def _slots_reply() -> bytes:
    """``CLUSTER SLOTS``: every slot on the answering server (``Drip`` fills in ``{port}``)."""
    node = b"*3\r\n$9\r\n127.0.0.1\r\n:{port}\r\n$40\r\n%s\r\n" % (b"0" * 40)
    return b"*1\r\n*3\r\n:0\r\n:16383\r\n" + node


def test_a_range_read_answered_with_an_integer_is_damage_not_an_allocation():
    huge = 1 << 40  # bytes(huge) would ask for a terabyte
    replies = {b"GETRANGE": b":%d\r\n" % huge, b"CLUSTER": _slots_reply()}
    node = Drip("redis", interval=1.0, drip_on=b"NONE", replies=replies)
    store = _store(f"redis-cluster://{HOST}:{node.port}")
    try:
        assert store.read_range(_name(1), 0, 4096) == b""  # present, damaged: no header
        assert store.read_log("ec-purge-log.ns", 65537) is None
    finally:
        store.close()
        node.close()
