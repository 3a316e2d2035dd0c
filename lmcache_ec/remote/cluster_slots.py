"""The slot map of a Redis Cluster: which primary owns which slot.

Built on first use by one caller, outside any lock, asking every startup node
(and every node of the current map) at once and keeping the first answer, so
a hung node costs nothing; other callers wait for that build at most
``remote_timeout``, and a failed build is not tried again for
``remote_retry_interval``: calls meanwhile raise ``StoreError`` at once.
Rebuilt the same way in the background (``refresh_soon``: a shard failed, a
node answered ``MOVED``), at most once per ``remote_retry_interval``; the
store then forgets the nodes that are no longer primaries (``on_new_map``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis.cluster
from redis.cluster import ClusterNode
from redis.exceptions import ConnectionError as RedisConnectionError

from ..config import RemoteSettings
from ..remote_names import NodeList
from .redis_store import client_options
from .store import StoreError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _Build:
    """One build of the slot map; callers that need it meanwhile wait on
    ``done`` instead of building their own."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.cluster: Any = None  # the client published, once done; None if it failed
        self.outcome = "the build failed"  # why there is no client


def first_answer(
    calls: Sequence[Callable[[], T]], name: str, discard: Callable[[T], object] | None = None
) -> T:
    """The first answer of ``calls``, each run at once in a thread of its own, or
    the last error if none answers. Each call ends by itself (socket timeouts);
    answers after the first go to ``discard``."""
    if not calls:
        raise RedisConnectionError("no node to ask")
    done = threading.Condition()
    answers: list[T] = []
    errors: list[Exception] = []

    def run(call: Callable[[], T]) -> None:
        try:
            answer = call()
        except Exception as exc:
            with done:
                errors.append(exc)
                done.notify()
            return
        with done:
            answers.append(answer)
            late = len(answers) > 1
            done.notify()
        if late and discard is not None:
            try:
                discard(answer)
            except Exception as exc:  # only a late answer's cleanup
                logger.debug("Discarding a late answer failed: %s", exc)

    for call in calls:
        threading.Thread(target=run, args=(call,), name=name, daemon=True).start()
    with done:
        done.wait_for(lambda: bool(answers) or len(errors) == len(calls))
        if answers:
            return answers[0]
        raise errors[-1]


class SlotMap:
    """redis-py's ``NodesManager`` of the cluster, built and rebuilt as above."""

    def __init__(
        self,
        nodes: NodeList,
        settings: RemoteSettings,
        where: str,
        on_new_map: Callable[[Any], None],
    ) -> None:
        self.timeout = settings.timeout
        self._nodes = nodes
        self._retry_interval = settings.retry_interval
        self._where = where
        self._on_new_map = on_new_map
        self._lock = threading.Lock()  # never held across I/O
        self._cluster: Any = None
        self._build: _Build | None = None  # the map being built, if any
        self._build_failed_until = 0.0  # a failed build is not retried before this
        self._build_error = ""
        self._refreshing = False  # a new map is being built in the background
        self._refresh_after = 0.0  # and none is built again before this

    @property
    def current(self) -> Any:
        """The map published, or None (not built yet, or closed)."""
        return self._cluster

    def get(self) -> Any:
        """The slot map (redis-py's ``NodesManager``), built on first use.

        One caller builds it; the others wait for that build at most
        ``remote_timeout``. After a failed build, calls raise ``StoreError`` at
        once for ``remote_retry_interval`` instead of building it again."""
        cluster = self._cluster
        if cluster is not None:
            return cluster
        with self._lock:
            if self._cluster is not None:
                return self._cluster
            build = self._build
            if build is None:
                remaining = self._build_failed_until - time.monotonic()
                if remaining > 0:
                    raise StoreError(
                        f"Redis Cluster {self._where} unreachable ({self._build_error}); "
                        f"retried in {remaining:.1f}s"
                    )
                build = self._build = _Build()
                building = True
            else:
                building = False
        if building:
            return self._build_cluster(build)
        if not build.done.wait(self.timeout):
            raise StoreError(f"Redis Cluster {self._where}: no slot map after {self.timeout}s")
        if build.cluster is None:
            raise StoreError(f"Redis Cluster {self._where} unreachable ({build.outcome})")
        return build.cluster

    def _build_cluster(self, build: _Build) -> Any:
        """Builds the slot map outside the lock (asking the nodes may take
        ``remote_timeout``) and publishes it, unless ``close`` ran meanwhile."""
        cluster = None
        try:
            try:
                cluster = self._new_cluster()
            except Exception as exc:
                build.outcome = str(exc) or type(exc).__name__
                with self._lock:
                    self._build_failed_until = time.monotonic() + self._retry_interval
                    self._build_error = build.outcome
                raise
            with self._lock:
                if self._build is build:  # else closed meanwhile: not ours to publish
                    if self._cluster is None:
                        self._cluster, cluster = cluster, None
                    build.cluster = self._cluster  # ours, or one published meanwhile
                else:
                    build.outcome = "the store was closed while it connected"
        finally:
            with self._lock:
                if self._build is build:
                    self._build = None
            build.done.set()
            if cluster is not None:  # not published: nobody else would close it
                cluster.close()
        if build.cluster is None:
            raise StoreError(f"Redis Cluster {self._where}: {build.outcome}")
        return build.cluster

    def _new_cluster(self) -> Any:
        """A slot map from the first node to answer ``CLUSTER SLOTS``. The startup
        nodes, and every node of the current map, are asked at once (each within
        ``remote_timeout``): a hung node costs nothing while another answers."""
        addresses = dict.fromkeys(self._nodes.nodes)
        current = self._cluster
        if current is not None:
            addresses.update(dict.fromkeys((n.host, n.port) for n in current.nodes_cache.values()))
        options = redis.cluster.cleanup_kwargs(
            username=self._nodes.username,
            password=self._nodes.password,
            **client_options(self.timeout),
        )

        def ask(host: str, port: int) -> Any:
            # Only CLUSTER SLOTS: RedisCluster would also fetch COMMAND from a
            # random primary, which may be the hung one.
            return redis.cluster.NodesManager(
                startup_nodes=[ClusterNode(host, port)],
                require_full_coverage=False,  # a shard down leaves the others usable
                dynamic_startup_nodes=False,
                **options,
            )

        calls = [functools.partial(ask, host, port) for host, port in addresses]
        return first_answer(calls, "ec-cluster-slots", discard=lambda late: late.close())

    def refresh_soon(self) -> None:
        """Builds the slot map again in the background (a failover or a resharding
        changed it): one build at a time, at most one per ``remote_retry_interval``,
        and no caller waits for it."""
        now = time.monotonic()
        with self._lock:
            if self._cluster is None or self._refreshing or now < self._refresh_after:
                return
            self._refreshing, self._refresh_after = True, now + self._retry_interval
        threading.Thread(target=self._refresh, name="ec-cluster-slots", daemon=True).start()

    def _refresh(self) -> None:
        try:
            cluster = self._new_cluster()
        except Exception as exc:
            logger.debug("Redis Cluster %s: slot map not refreshed: %s", self._where, exc)
            cluster = None
        with self._lock:
            self._refreshing = False
            published = cluster if self._cluster is not None else None  # else closed
            if published is not None:
                self._cluster, cluster = published, self._cluster
        if cluster is not None:
            cluster.close()  # the map replaced, or one built after close
        if published is not None:
            self._on_new_map(published)

    def close(self) -> None:
        # Never waits for a build in progress: its builder closes what it built.
        with self._lock:
            cluster, self._cluster = self._cluster, None
            self._build = None
        if cluster is not None:
            cluster.close()
