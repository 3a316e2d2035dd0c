"""The Redis Cluster store (``redis-cluster://``).

The slot map is redis-py's ``NodesManager`` (``CLUSTER SLOTS``); each call goes
to the owning primary's own client, so a shard that is down costs only its own
keys: their calls raise ``ShardUnavailable`` (batched reads answer None for
them) and the shard is skipped at once. Every ``remote_retry_interval`` one
ping in the background tries it again; callers keep skipping it until that
ping answers, so a hung shard never holds a caller after its first failure.
Batched reads send one pipeline per primary.

The map (``cluster_slots.py``) is built again in the background when a call
to a shard fails (a replica may take over its slots) and when a node answers
``MOVED``; nodes that are no longer primaries are then forgotten. A ``MOVED``
or ``ASK`` reply (a resharding) is followed once to the node it names, so the
key is answered there; redirected again, only that key misses. The health probe pings every
primary at once and answers on the first that answers. Keys, bounded reads and
timeouts: ``redis_store.py``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from redis.client import Pipeline
from redis.cluster import ClusterNode
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from ..config import RemoteSettings
from ..remote_names import (
    NodeList,
    claim_key,
    parse_node_list,
    redact,
    redis_data_key,
    redis_meta_key,
)
from .bounded import bounded_frame
from .cluster_slots import SlotMap, first_answer
from .redis_store import (
    _NODE_ERRORS,
    APPEND_LOG,
    CLAIM,
    RELEASE,
    _failed,
    _metadata,
    _present_value,
    _queue_read,
    _scan,
    _sized,
    _wrong_type,
    client_options,
)
from .store import RemoteStore, ShardUnavailable, StoreError

logger = logging.getLogger(__name__)

# Replies of a node that answers but does not serve its slots now (MasterDownError
# is a ClusterDownError).
_NOT_SERVING = (ClusterDownError, TryAgainError)

Queue = Callable[[Any], object]  # queues one call's commands on a pipeline
KeyQueue = Callable[[Any, str], object]  # queues one key's commands on a pipeline


class _AskingPipeline(Pipeline):
    """Sends ``ASKING`` before each command: the node is importing the slot (an
    ``ASK`` redirect) and answers for its keys only right after ``ASKING``."""

    def pipeline_execute_command(self, *args: Any, **options: Any) -> Any:
        super().pipeline_execute_command("ASKING")
        return super().pipeline_execute_command(*args, **options)


def _redirect(replies: Sequence[Any]) -> AskError | None:
    """The ``MOVED`` or ``ASK`` reply among ``replies`` (``MovedError`` is an ``AskError``)."""
    return next((reply for reply in replies if isinstance(reply, AskError)), None)


def _string(reply: Any) -> bytes:
    """A string reply's bytes; any other reply (a hostile server's integer) is
    empty, never an allocation the reply asks for."""
    return bytes(reply) if isinstance(reply, (bytes, bytearray, memoryview)) else b""


def _answer(replies: list[Any], several: bool) -> Any:
    """A key's answer from its replies in a batch: None if one failed. A key of
    another type is answered as such (a damaged entry, ``_sized``), not None."""
    if several:
        return None if any(_failed(reply) for reply in replies) else replies
    (reply,) = replies
    return None if isinstance(reply, Exception) and not _wrong_type(reply) else reply


def _queue_range(pipe: Any, key: str, start: int, end: int) -> None:
    pipe.exists(key)
    pipe.getrange(key, start, end)


class RedisClusterStore(RemoteStore):
    """A Redis Cluster: each call on the primary owning the key's slot."""

    def __init__(self, nodes: NodeList, settings: RemoteSettings) -> None:
        self.timeout = settings.timeout
        self.max_frame = settings.max_frame_bytes
        self._where = redact(settings.url)
        self._nodes = nodes
        self._retry_interval = settings.retry_interval
        self._slots = SlotMap(nodes, settings, self._where, self._on_new_map)
        self._lock = threading.Lock()  # guards ``_clients``; never held across I/O
        # Our own client per primary, for every call: the slot map's node clients
        # drop connection keywords they do not know (``command_packer``).
        self._clients: dict[str, redis.Redis] = {}
        self._down_until: dict[str, float] = {}
        self._returning: set[str] = set()  # pinged after an outage, no call answered yet
        self._pinging: set[str] = set()  # primaries whose ping is not answered yet
        self._closed = False

    def _on_new_map(self, cluster: Any) -> None:
        with self._lock:
            departed = self._forget_departed(cluster)
        self._departed(departed)

    def _forget_departed(self, cluster: Any) -> list[tuple[str, redis.Redis | None, bool]]:
        """Drops the state of nodes that are no longer primaries (under the lock):
        each one's name, client and whether it was down."""
        primaries = {node.name for node in cluster.get_nodes_by_server_type("primary")}
        names = set(self._clients) | set(self._down_until) | set(self._returning)
        departed = []
        for name in names - primaries:
            down = self._down_until.pop(name, None) is not None or name in self._returning
            self._returning.discard(name)
            departed.append((name, self._clients.pop(name, None), down))
        return departed

    def _departed(self, departed: list[tuple[str, redis.Redis | None, bool]]) -> None:
        for _, client, _ in departed:
            if client is not None:  # a call still using it keeps its connection
                client.connection_pool.disconnect(inuse_connections=False)
        replaced = sorted(name for name, _, down in departed if down)
        if replaced:
            logger.warning(
                "Redis Cluster shard %s replaced: its slots have another primary now",
                ", ".join(replaced),
            )
            self._shard_back()  # what was written meanwhile goes to the new primary

    def _primaries(self) -> list[Any]:
        return self._slots.get().get_nodes_by_server_type("primary")

    def _node_of(self, key: str) -> Any:
        slot = key_slot(key.encode())
        try:
            return self._slots.get().get_node_from_slot(slot)
        except SlotNotCoveredError as exc:  # no primary serves it: this key misses
            self._slots.refresh_soon()
            raise ShardUnavailable(str(exc)) from exc

    def _node_client(self, node: Any) -> redis.Redis:
        down = self._down_until.get(node.name)
        if down is not None:
            if time.monotonic() >= down:
                self._try_shard(node)
            if self._all_down():
                raise StoreError("no Redis Cluster primary answers")
            raise ShardUnavailable(f"shard {node.name} is down")
        return self._client_of(node)

    def _try_shard(self, node: Any) -> None:
        """Pings a down shard in the background: every caller goes on skipping
        it until the ping answers (a hung shard would hold each one its timeout)."""
        if not self._start_ping(node):
            return
        try:
            threading.Thread(
                target=self._trial, args=(node,), name="ec-cluster-shard-trial", daemon=True
            ).start()
        except RuntimeError as exc:  # no thread to be had: tried again after the interval
            self._end_ping(node)
            self._shard_failed(node, exc)

    def _trial(self, node: Any) -> None:
        try:
            self._ping_claimed(node)
        except Exception as exc:  # still down: skipped for another interval, no new warning
            with contextlib.suppress(Exception):  # a thread of its own: nobody to raise to
                self._shard_failed(node, exc)

    def _start_ping(self, node: Any) -> bool:
        """Claims ``node``'s one ping in flight; False if it has one (or we are closed)."""
        with self._lock:
            if node.name in self._pinging or self._closed:
                return False
            self._pinging.add(node.name)
            return True

    def _end_ping(self, node: Any) -> None:
        with self._lock:
            self._pinging.discard(node.name)

    def _ping_answered(self, node: Any) -> None:
        """Callers go to a down shard again; it is back once one of them is answered."""
        with self._lock:
            if self._down_until.pop(node.name, None) is not None:
                self._returning.add(node.name)

    def _client_of(self, node: Any) -> redis.Redis:
        client = self._clients.get(node.name)
        if client is None:
            with self._lock:
                client = self._clients.get(node.name)
                if client is None:
                    pool = redis.ConnectionPool(
                        host=node.host,
                        port=node.port,
                        username=self._nodes.username,
                        password=self._nodes.password,
                        **client_options(self.timeout),
                    )
                    client = self._clients[node.name] = redis.Redis(connection_pool=pool)
        return client

    def _answered(self, node: Any) -> None:
        if node.name not in self._returning:
            return
        self._returning.discard(node.name)
        logger.warning("Redis Cluster shard %s available again", node.name)
        self._shard_back()

    def _shard_back(self) -> None:
        callback = self.on_shard_back
        if callback is not None:
            try:
                callback()
            except Exception as exc:
                logger.warning("Shard recovery hook failed: %s", exc)

    def _shard_failed(self, node: Any, exc: BaseException) -> ShardUnavailable:
        still_down = node.name in self._returning or node.name in self._down_until
        self._returning.discard(node.name)
        if not still_down:  # logged once per outage
            logger.warning(
                "Redis Cluster shard %s unavailable (%s); its keys miss, retried in %.1fs",
                node.name,
                exc,
                self._retry_interval,
            )
        self._down_until[node.name] = time.monotonic() + self._retry_interval
        self._slots.refresh_soon()  # a replica may take over its slots
        if self._all_down():
            return StoreError(f"no Redis Cluster primary answers (last: {node.name}: {exc})")
        return ShardUnavailable(f"shard {node.name}: {exc}")

    def _all_down(self) -> bool:
        """Every primary failed recently: the store is down, not a shard."""
        primaries = self._primaries()
        return bool(primaries) and all(node.name in self._down_until for node in primaries)

    def _send(self, node: Any, queue: Queue, *, asking: bool = False) -> list[Any]:
        """``queue``'s commands on ``node`` in one round trip: their replies, error
        replies among them. ``asking``: each sent after ``ASKING`` (an ``ASK`` redirect)."""
        client = self._node_client(node)
        if asking:
            pipe = _AskingPipeline(client.connection_pool, client.response_callbacks, False, None)
        else:
            pipe = client.pipeline(transaction=False)
        queue(pipe)
        try:
            replies = pipe.execute(raise_on_error=False)
        except _NODE_ERRORS as exc:
            raise self._shard_failed(node, exc) from exc
        # A node that answers but does not serve (CLUSTERDOWN, MASTERDOWN while it
        # rejoins; TRYAGAIN): its shard is down for now, not the tier, nor back yet.
        refused = next((r for r in replies if isinstance(r, _NOT_SERVING)), None)
        if refused is not None:
            raise self._shard_failed(node, refused)
        self._answered(node)
        return replies[1::2] if asking else replies

    def _redirected(self, redirect: AskError) -> tuple[Any, bool]:
        """Where a ``MOVED`` or ``ASK`` reply sends the call, and whether with ``ASKING``."""
        moved = isinstance(redirect, MovedError)
        if moved:
            self._slots.refresh_soon()  # the slot has another owner: the map is stale
        return ClusterNode(redirect.host, redirect.port), not moved

    def _run(self, key: str, queue: Queue, *, check: bool = True) -> list[Any]:
        """``queue``'s commands, in one round trip to the primary owning ``key``:
        their replies. A slot being moved (``MOVED``, ``ASK``) is followed once;
        moved again, the key misses. ``check``: an error reply raises."""
        replies = self._send(self._node_of(key), queue)
        redirect = _redirect(replies)
        if redirect is not None:
            node, asking = self._redirected(redirect)
            replies = self._send(node, queue, asking=asking)
            again = _redirect(replies)
            if again is not None:
                raise ShardUnavailable(f"slot {again.slot_id} is moving: {again}")
        if check:
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return replies

    def exists(self, name: str) -> bool:
        key = redis_data_key(name)
        (found,) = self._run(key, lambda pipe: pipe.exists(key))
        return bool(found)

    def get(self, name: str) -> bytes | None:
        key = redis_data_key(name)
        replies = self._run(key, lambda p: _queue_read(p, key, self.max_frame), check=False)
        return bounded_frame(name, _present_value(replies), self.max_frame)

    def _batch(
        self, node: Any, keys: Sequence[str], one: KeyQueue, *, asking: bool = False
    ) -> list[list[Any]] | None:
        """Each key's replies to ``one``, in one pipeline to ``node``; None if its
        shard is unavailable."""

        def queue(pipe: Any) -> None:
            for key in keys:
                one(pipe, key)

        try:
            replies = self._send(node, queue, asking=asking)
        except ShardUnavailable:
            return None
        per_key = len(replies) // max(len(keys), 1)
        return [replies[i * per_key : (i + 1) * per_key] for i in range(len(keys))]

    def _per_node(
        self, keys: Sequence[str], command: str, queue: KeyQueue | None = None
    ) -> list[Any]:
        """``command`` of each key, one pipeline per primary; None for down shards.

        ``queue(pipe, key)``: several commands per key instead; the key's answer
        is then the list of their replies (None if any failed). Keys whose slot
        is being moved are asked again where their node said, once."""
        one: KeyQueue = queue or (lambda pipe, key: getattr(pipe, command)(key))
        groups: dict[str, tuple[Any, list[int]]] = {}
        for index, key in enumerate(keys):
            try:
                node = self._node_of(key)
            except ShardUnavailable:
                continue  # its slot has no primary: a miss
            groups.setdefault(node.name, (node, []))[1].append(index)
        answers: list[Any] = [None] * len(keys)
        redirects: dict[tuple[str, bool], tuple[Any, list[int]]] = {}
        for node, indices in groups.values():
            replies = self._batch(node, [keys[i] for i in indices], one)
            if replies is None:
                continue
            for index, reply in zip(indices, replies, strict=True):
                redirect = _redirect(reply)
                if redirect is None:
                    answers[index] = _answer(reply, queue is not None)
                    continue
                target, asking = self._redirected(redirect)
                redirects.setdefault((target.name, asking), (target, []))[1].append(index)
        for (_, asking), (target, indices) in redirects.items():
            again = self._batch(target, [keys[i] for i in indices], one, asking=asking)
            for index, answer in zip(indices, again or [], strict=False):
                if _redirect(answer) is None:  # moved again: a miss
                    answers[index] = _answer(answer, queue is not None)
        return answers

    def exists_many(self, names: Sequence[str]) -> list[bool | None]:
        found = self._per_node([redis_data_key(name) for name in names], "exists")
        return [None if answer is None else bool(answer) for answer in found]

    def get_many(self, names: Sequence[str]) -> list[bytes | None]:
        keys = [redis_data_key(name) for name in names]
        replies = self._per_node(keys, "read", lambda p, k: _queue_read(p, k, self.max_frame))
        return [
            bounded_frame(name, _present_value(reply), self.max_frame)
            for name, reply in zip(names, replies, strict=True)
        ]

    def put(self, name: str, data: bytes | memoryview) -> None:
        # The two keys live in different slots: data first, metadata last
        # (existence is the frame's, so a reader never sees a partial entry).
        data_key, meta_key = redis_data_key(name), redis_meta_key(name)
        self._run(data_key, lambda pipe: pipe.set(data_key, data))
        self._run(meta_key, lambda pipe: pipe.set(meta_key, _metadata(len(data))))

    def delete(self, name: str) -> bool:
        data_key, meta_key = redis_data_key(name), redis_meta_key(name)
        (removed,) = self._run(data_key, lambda pipe: pipe.delete(data_key))
        self._run(meta_key, lambda pipe: pipe.delete(meta_key))
        return removed > 0

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        # Each primary is scanned for frame (data) keys, the entries (``_scan``),
        # then each frame is sized on the primary owning its slot now. A key that
        # moves between primaries during the scan is missed or seen twice: the
        # slots must not have moved from before the first scan to after the last.
        before = self._slot_owners()
        seen: set[str] = set()
        for node in self._primaries():
            try:
                batches = list(_scan(self._node_client(node), prefix))
            except _NODE_ERRORS as exc:
                raise self._shard_failed(node, exc) from exc
            for names in batches:
                names = [name for name in names if name not in seen]
                seen.update(names)
                sizes = self._per_node([redis_data_key(name) for name in names], "strlen")
                if any(size is None for size in sizes):
                    raise ShardUnavailable("a shard did not answer: the listing is partial")
                yield from _sized(names, sizes)
        if self._slot_owners() != before:
            raise ShardUnavailable("slots moved during the listing: it may be partial")

    def _slot_owners(self) -> tuple[Any, ...]:
        """Each primary's slots as it tells them itself; raises while a slot is
        being moved (``MIGRATING``/``IMPORTING``: its keys are on two primaries)."""
        owners = []
        for node in self._primaries():
            try:
                view = self._node_client(node).cluster("nodes")
            except _NODE_ERRORS as exc:
                raise self._shard_failed(node, exc) from exc
            mine = next((v for v in view.values() if "myself" in v["flags"]), None)
            if mine is None or mine["migrations"]:
                raise ShardUnavailable(f"slots are being moved ({node.name}): no listing now")
            owners.append((mine["node_id"], sorted(map(tuple, mine["slots"]))))
        return tuple(sorted(owners))

    def read_range(self, name: str, start: int, length: int) -> bytes | None:
        key = redis_data_key(name)
        end = start + length - 1
        present, data = self._run(key, lambda pipe: _queue_range(pipe, key, start, end))
        return _string(data) if present else None

    def read_log(self, name: str, size: int) -> bytes | None:
        # An empty log holds no record: absent or empty read alike (one command).
        (data,) = self._run(name, lambda pipe: pipe.getrange(name, -size, -1))
        return _string(data) or None

    def append_log(self, name: str, line: bytes, limit: int) -> None:
        self._run(name, lambda pipe: pipe.eval(APPEND_LOG, 1, name, line, limit))

    def claim(self, name: str, ttl_s: float) -> bool:
        # EVAL, not the script's EVALSHA: a pipeline would first ask SCRIPT EXISTS.
        key, args = claim_key(name), [self.claim_owner, max(1, int(ttl_s * 1000))]
        (won,) = self._run(key, lambda pipe: pipe.eval(CLAIM.script, 1, key, *args))
        return bool(won)

    def release(self, name: str) -> None:
        key = claim_key(name)
        self._run(key, lambda pipe: pipe.eval(RELEASE.script, 1, key, self.claim_owner))

    def ping(self) -> None:
        """Answers if any primary does: a down shard alone is not a down tier.

        Every primary is pinged at once, so a hung one costs nothing while
        another answers; one whose earlier ping is still unanswered is not
        pinged again (at most one waiting thread per primary)."""
        failures: list[str] = []

        def ping(node: Any) -> None:
            try:
                self._ping(node)
            except _NODE_ERRORS as exc:
                failures.append(f"{node.name}: {exc}")
                raise

        calls = [functools.partial(ping, node) for node in self._primaries()]
        try:
            first_answer(calls, "ec-cluster-ping")
        except _NODE_ERRORS as exc:
            answers = "; ".join(failures)
            raise RedisConnectionError(f"no cluster primary answers: {answers}") from exc

    def _ping(self, node: Any) -> None:
        if not self._start_ping(node):
            raise RedisConnectionError("its previous ping is still unanswered")
        self._ping_claimed(node)

    def _ping_claimed(self, node: Any) -> None:
        """Ping ``node``, whose one ping in flight the caller claimed (``_start_ping``)."""
        try:
            self._client_of(node).ping()
            self._ping_answered(node)
        finally:
            self._end_ping(node)

    def close(self) -> None:
        # Never waits for a build in progress: its builder closes what it built.
        self._slots.close()
        with self._lock:
            self._closed = True
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.connection_pool.disconnect()

    def abort(self) -> None:
        # The slot map's connections carry no call: only the nodes' own clients.
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            client.connection_pool.disconnect()

    def describe(self) -> str:
        return self._where


def open_redis_cluster(settings: RemoteSettings) -> RedisClusterStore:
    return RedisClusterStore(parse_node_list(settings.url, service=False), settings)
