"""``ECRemoteBackend``: LMCache's ``RemoteBackend`` that never stalls its caller.

Upstream's remote backend waits without a timeout in ``contains`` and
``close``, connects once (reconnection is left to an engine-level
``HealthMonitor`` that an encoder tier does not run), and re-uploads keys the
store already has. This subclass keeps its structure — ``init_connection``, ``put_tasks``, the
serializer, connectors of the plugin framework — talks to ``remote_url``
through ``ECStoreConnector`` over the store it names (``open_store``), and adds:

- a bound of ``remote_timeout`` on every operation: blocking reads of
  lmcache-ec's connectors (``get_sync``/``exists_sync``) run under a
  ``Deadline`` (a whole read, not only each socket operation); everything
  else runs on the event loop under ``asyncio.wait_for`` and the caller
  waits at most that long too;
- a health state: the first failed or slow call marks the tier unavailable;
  while it is, lookups miss and writes stay local at once (no piling up of
  threads, futures or buffers), and one probe coroutine pings the store
  (``RemoteConnector.ping``, as upstream's ``RemoteBackendHealthCheck``
  does) every ``remote_retry_interval`` seconds, rebuilding the connector if
  needed, until it answers;
- asynchronous uploads that first ask the store whether the key is there,
  and remember keys known to be stored, so a put of a stored key sends no
  bytes;
- a sharded store's partial outage (``ShardUnavailable``) is a miss of the
  keys on the lost shard only; the tier stays available for the others;
- ``close`` bounded by the timeout.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector import InstrumentedRemoteConnector
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.remote_backend import RemoteBackend

from ..config import RemoteSettings, from_lmcache
from ..remote_names import redact, redact_text
from ..tier_contract import TierDefaults, TierKind
from .deadline import GRACE, Deadline, LateAnswer, ReadersBusy
from .health import RecentKeys, RemoteHealth
from .lmcache_connector import ECStoreConnector
from .store import READ_BATCH, ShardUnavailable, StoreBusy, open_store

logger = logging.getLogger(__name__)


class _RedactCredentials(logging.Filter):
    """LMCache logs remote URLs, passwords included, when it connects."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


for _name in (
    "lmcache.v1.storage_backend.remote_backend",
    "lmcache.v1.storage_backend.connector",
    "lmcache.v1.storage_backend.connector.redis_adapter",
    "lmcache.v1.storage_backend.connector.redis_connector",
):
    logging.getLogger(_name).addFilter(_RedactCredentials())

MISSED_LIMIT = 100_000  # keys remembered for re-upload after an outage
CONNECT_ERRORS_KEPT = 64  # distinct connector errors already logged at WARNING
READERS = 16  # threads running blocking reads (``Deadline``)
_MISS = object()


def _release_late(future: Future) -> None:
    """Free a buffer that a read abandoned by its caller produced anyway."""
    if not future.cancelled() and future.exception() is None:
        result = future.result()
        if isinstance(result, MemoryObj):
            result.ref_count_down()


def _miss_counter(exc: ShardUnavailable) -> str:
    """The counter of a call that missed, the store being up."""
    return "busy_misses" if isinstance(exc, StoreBusy) else "shard_misses"


def _shown(exc: object) -> str:
    """``exc`` as a log line may show it: an endpoint's password replaced by ``***``."""
    return redact_text(str(exc)) or type(exc).__name__


def _unwrapped(connection: RemoteConnector) -> RemoteConnector:
    if isinstance(connection, InstrumentedRemoteConnector):
        return connection.getWrappedConnector()
    return connection


class ECRemoteBackend(TierDefaults, RemoteBackend):
    kind = TierKind.REMOTE

    def __init__(
        self,
        config: LMCacheEngineConfig,
        metadata: LMCacheMetadata,
        loop: asyncio.AbstractEventLoop,
        local_cpu_backend: LocalCPUBackend | None,
        dst_device: str = "cpu",
        plugin_name: str | None = None,
        settings: RemoteSettings | None = None,
    ) -> None:
        self.settings = settings or from_lmcache(config).remote
        self.timeout = self.settings.timeout
        self.retry_interval = self.settings.retry_interval
        self._known = RecentKeys()
        self._closed = False
        # Keys whose upload was skipped or failed while the store was down;
        # re-uploaded from the local tiers when it returns (see ECCache).
        self._missed: OrderedDict[CacheEngineKey, None] = OrderedDict()
        self._missed_lock = threading.Lock()
        self.on_recovered: Callable[[], None] | None = None
        self._connect_errors: OrderedDict[str, None] = OrderedDict()
        self._deadline = Deadline(self.timeout + GRACE, self._abort, READERS, "ec-remote-read")
        # The primary remote; create_remote_backends renames the others.
        self.backend_name = "RemoteBackend"
        self.name = "remote"
        self.health = RemoteHealth(
            loop,
            self._where,
            self._probe_once,
            self.timeout,
            self.retry_interval,
            on_up=self._recovered,
        )
        super().__init__(config, metadata, loop, local_cpu_backend, dst_device, plugin_name)
        self.min_reconnect_interval = self.retry_interval
        if self.connection is None:
            self._mark_down("connect", "no connector")

    # -- connection and health ------------------------------------------------

    def init_connection(self) -> None:
        if self.connection is not None:
            return
        try:
            if self.plugin_name is None:
                store = open_store(self.settings)
                store.on_shard_back = self._recovered  # re-send what that shard missed
                connector = ECStoreConnector(store, self.loop, self.local_cpu_backend)
                self.connection = InstrumentedRemoteConnector(connector)
            else:
                super().init_connection()
        except Exception as exc:  # upstream re-raises IrrecoverableException
            self.failure_time = time.time()
            self.connection = None
            self._connect_failed(exc)

    def _connect_failed(self, exc: Exception) -> None:
        """One WARNING per distinct error: each probe (remote_retry_interval) retries."""
        message = _shown(exc)
        seen = message in self._connect_errors
        self._connect_errors[message] = None
        if len(self._connect_errors) > CONNECT_ERRORS_KEPT:
            self._connect_errors.popitem(last=False)
        level = logging.DEBUG if seen else logging.WARNING
        logger.log(level, "Remote connector for %s not created: %s", self._where(), message)

    def _where(self) -> str:
        if getattr(self, "plugin_name", None):
            return f"plugin {self.plugin_name}"
        settings = getattr(self, "settings", None)
        return redact(settings.url if settings is not None else None)

    @property
    def available(self) -> bool:
        """False between a failed remote call and the next successful probe."""
        return self.health.up and self.connection is not None

    @property
    def counters(self) -> Counter[str]:
        return self.health.counters

    def _mark_down(self, operation: str, exc: object) -> None:
        self.health.failed(operation, _shown(exc))

    def remember_missed(self, keys: Sequence[CacheEngineKey]) -> None:
        """Record keys the store does not have because it was unavailable."""
        with self._missed_lock:
            for key in keys:
                self._missed[key] = None
                self._missed.move_to_end(key)
            while len(self._missed) > MISSED_LIMIT:
                self._missed.popitem(last=False)

    def forget_stored(self) -> None:
        """Forget which keys the store holds (entries were purged elsewhere)."""
        self._known.clear()

    def take_missed(self) -> list[CacheEngineKey]:
        with self._missed_lock:
            keys = list(self._missed)
            self._missed.clear()
        return keys

    def _recovered(self) -> None:
        callback = self.on_recovered
        if callback is not None and not self._closed:
            callback()

    async def _probe_once(self) -> None:
        """Rebuild the connector if needed and ping it; raises unless healthy."""
        if self.connection is None:
            self.init_connection()
        connection = self.connection
        if connection is None:
            raise ConnectionError("no connector")
        if connection.support_ping():
            code = await connection.ping()
            if code != 0:
                raise ConnectionError(f"ping returned error code {code}")
        else:
            await connection.exists(CacheEngineKey("ec-probe", 1, 0, 0, None))

    def _call(
        self,
        operation: str,
        make: Callable[[RemoteConnector], Coroutine[Any, Any, Any]],
        release_late: bool = False,
    ) -> Any:
        """Run ``make(connection)`` on the loop within the timeout; ``_MISS`` if not."""
        connection = self.connection
        if connection is None or not self.health.up:
            return _MISS
        future = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(make(connection), self.timeout), self.loop
        )
        try:
            return future.result(self.timeout + GRACE)
        except Exception as exc:
            if release_late:
                future.add_done_callback(_release_late)
            future.cancel()
            self._mark_down(operation, exc)
            return _MISS

    def _blocking(
        self,
        operation: str,
        call: Callable[[Any], Any],
        late: Callable[[Future], None] | None = None,
    ) -> Any:
        """Run ``call(connector)`` within the timeout (``Deadline``); ``_MISS`` if
        unavailable, failing or late. For connectors with blocking reads (``get_sync``).
        """
        connection = self.connection
        if connection is None or not self.health.up:
            return _MISS
        try:
            return self._deadline.run(call, _unwrapped(connection), late=late)
        except ShardUnavailable as exc:
            self.health.count(_miss_counter(exc))
            return _MISS
        except ReadersBusy:  # this process is busy, not the store
            self.health.count("reads_busy")
            return _MISS
        except Exception as exc:
            if isinstance(exc, LateAnswer):
                self.health.count("late_reads")
            self._mark_down(operation, exc)
            return _MISS

    def _abort(self) -> None:
        connection = self.connection
        abort = getattr(_unwrapped(connection), "abort", None) if connection else None
        if abort is not None:
            abort()

    def _has_blocking_reads(self) -> bool:
        connection = self.connection
        return connection is not None and hasattr(_unwrapped(connection), "get_sync")

    # -- reads ---------------------------------------------------------------

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        if self._has_blocking_reads():
            found = self._blocking("contains", lambda c: c.exists_sync(key))
        else:
            found = self._call("contains", lambda c: c.exists(key))
        return found is not _MISS and bool(found)

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        for count, key in enumerate(keys):
            if not self.contains(key):
                return count
        return len(keys)

    @property
    def reads_frames(self) -> bool:
        """True when ``get_frame`` works: the connector reads frames as bytes."""
        connection = self.connection
        return connection is not None and hasattr(_unwrapped(connection), "get_frame_sync")

    def get_frame(self, key: CacheEngineKey) -> bytes | None:
        """The stored frame as bytes, or None (miss, or the store unavailable).

        The caller verifies the bytes and decides whether they go into the CPU
        pool: a read that goes straight to the caller needs no pool buffer.
        """
        data = self._blocking("get", lambda c: c.get_frame_sync(key))
        if data is _MISS or data is None:
            return None
        self._known.add(key)
        return data

    @property
    def reads_frame_batches(self) -> bool:
        """True when ``get_frames`` fetches several frames in one request."""
        connection = self.connection
        return connection is not None and hasattr(_unwrapped(connection), "get_frames_sync")

    def get_frames(self, keys: list[CacheEngineKey]) -> list[bytes | None]:
        """``get_frame`` for several keys, ``READ_BATCH`` a request, each request
        bounded on its own (a large batch may take longer than one timeout);
        None for those of a request that failed."""
        frames: list[bytes | None] = []
        for first in range(0, len(keys), READ_BATCH):
            batch = keys[first : first + READ_BATCH]
            answer = self._blocking("get", lambda c, b=batch: c.get_frames_sync(b))
            frames += [None] * len(batch) if answer is _MISS else answer
        for key, data in zip(keys, frames, strict=True):
            if data is not None:
                self._known.add(key)
        return frames

    @property
    def batched_reads(self) -> bool:
        return self.reads_frame_batches

    def read(self, key: CacheEngineKey) -> bytes | MemoryObj | None:
        return self.get_frame(key) if self.reads_frames else self.get_blocking(key)

    def read_many(self, keys: Sequence[CacheEngineKey]) -> list[Any]:
        if self.reads_frame_batches:
            return self.get_frames(list(keys))
        return [self.read(key) for key in keys]

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        if self.local_cpu_backend is None:
            return None  # scheduler role: nowhere to put the bytes
        if self._has_blocking_reads():
            memory_obj = self._blocking("get", lambda c: c.get_sync(key), late=_release_late)
        else:
            memory_obj = self._call("get", lambda c: c.get(key), release_late=True)
        if memory_obj is _MISS or memory_obj is None:
            return None
        self._known.add(key)
        return self.deserializer.deserialize(memory_obj)

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return [self.get_blocking(key) for key in keys]

    # -- writes --------------------------------------------------------------

    def submit_put_task(
        self,
        key: CacheEngineKey,
        memory_obj: MemoryObj,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> Future:
        done: Future = Future()
        done.set_result(None)
        connection = self.connection
        if connection is None or self._closed or not self.health.up:
            self.health.count("upload_skipped_unavailable")
            if not self._closed:
                self.remember_missed([key])
            return done
        if key in self._known:
            self.health.count("upload_skipped_existing")
            return done
        with self.lock:
            if key in self.put_tasks:
                return done
            self.put_tasks.add(key)
        payload = self.serializer.serialize(memory_obj)  # our own reference
        connector = _unwrapped(connection)
        try:
            if isinstance(connector, ECStoreConnector):
                # Queued by this thread straight to the store's threads: a hop
                # through the event loop wakes it with a socket write, which
                # hands the loop the GIL in the middle of the caller's put.
                future = connector.submit(self._send, connector, key, payload)
                # A job cancelled at close never ran: its reference is released here.
                future.add_done_callback(lambda f: f.cancelled() and payload.ref_count_down())
            else:
                future = asyncio.run_coroutine_threadsafe(
                    self._upload(connection, key, payload), self.loop
                )
        except Exception:
            payload.ref_count_down()
            with self.lock:
                self.put_tasks.discard(key)
            if self._closed:
                return done  # closed under us: the entry stays in the local tiers
            raise
        future.add_done_callback(lambda f: self._upload_done(key, on_complete_callback))
        return future

    def _send(self, connector: ECStoreConnector, key: CacheEngineKey, obj: MemoryObj) -> None:
        """One upload on the store's threads; releases ``obj`` when done.

        The store bounds each call itself; queueing behind other uploads is
        not a failure of the store. One still queued when the tier went down
        is remembered for the replay (``storage/replay.py``), not tried: each
        would wait out the timeout holding its pool buffer.
        """
        try:
            if self._closed or not self.health.up:  # queued before the tier went down
                self.health.count("upload_skipped_unavailable")
                if not self._closed:
                    self.remember_missed([key])
                return
            self._uploaded(key, connector.send_frame(key, obj))
        except Exception as exc:
            self._upload_failed(key, exc)
        finally:
            obj.ref_count_down()

    async def _upload(
        self, connection: RemoteConnector, key: CacheEngineKey, obj: MemoryObj
    ) -> None:
        """One upload through a plugin's connector, on the event loop."""
        # The unwrapped connector's put leaves the reference to us, so it is
        # released even if the timeout cancels the put before it starts.
        try:
            if await asyncio.wait_for(connection.exists(key), self.timeout):
                sent = False
            else:
                await asyncio.wait_for(_unwrapped(connection).put(key, obj), self.timeout)
                sent = True
            self._uploaded(key, sent)
        except Exception as exc:
            self._upload_failed(key, exc)
        finally:
            obj.ref_count_down()

    def _uploaded(self, key: CacheEngineKey, sent: bool) -> None:
        self._known.add(key)
        self.health.count("uploads" if sent else "upload_skipped_existing")

    def _upload_failed(self, key: CacheEngineKey, exc: Exception) -> None:
        if not isinstance(exc, StoreBusy):  # refused for now: no outage ends to re-send it
            self.remember_missed([key])
        if isinstance(exc, ShardUnavailable):
            self.health.count(_miss_counter(exc))  # only this key's shard is down
        else:
            self._mark_down("put", exc)

    def _upload_done(
        self, key: CacheEngineKey, callback: Callable[[CacheEngineKey], None] | None
    ) -> None:
        with self.lock:
            self.put_tasks.discard(key)
        if callback is not None:
            try:
                callback(key)
            except Exception as exc:
                logger.warning("on_complete_callback failed for %s: %s", key, exc)

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        memory_objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> None:
        for key, memory_obj in zip(keys, memory_objs, strict=True):
            self.submit_put_task(key, memory_obj, on_complete_callback)

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        return self._remove(key, damaged=False)

    def remove_damaged(self, key: CacheEngineKey) -> bool:
        """``remove`` of an entry read damaged here (``RemoteStore.delete_damaged``)."""
        return self._remove(key, damaged=True)

    def _remove(self, key: CacheEngineKey, damaged: bool) -> bool:
        self._known.discard(key)
        connection = self.connection
        if connection is None or not self.health.up:
            return False
        if self._has_blocking_reads():  # ours: a whole call within the timeout
            if damaged:
                removed = self._blocking("remove", lambda c: c.remove_damaged_sync(key))
            else:
                removed = self._blocking("remove", lambda c: c.remove_sync(key))
            return removed is not _MISS and bool(removed)
        try:
            return bool(connection.remove_sync(key))
        except (NotImplementedError, ShardUnavailable):
            return False
        except Exception as exc:
            self._mark_down("remove", exc)
            return False

    def pending_writes(self) -> int:
        with self.lock:
            return len(self.put_tasks)

    def snapshot(self) -> dict[str, Any]:
        """Health and counters, for stats exporters."""
        with self._missed_lock:
            awaiting = len(self._missed)
        return {
            "available": self.available,
            "pending": self.pending_writes(),
            "awaiting_resend": awaiting,
            **self.counters,
        }

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        self._closed = True
        with self._missed_lock:
            unsent = len(self._missed)
        if unsent:  # remembered in memory only: a restart does not re-send them
            logger.warning(
                "Remote tier %s: %d entries written while it was down were never re-sent "
                "(closed before it came back): other instances miss them until written again",
                self._where(),
                unsent,
            )
        self.health.close()
        self._deadline.close()
        connection = self.connection
        if connection is None:
            return
        future = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(connection.close(), self.timeout), self.loop
        )
        try:
            future.result(self.timeout + GRACE)
        except Exception as exc:
            future.cancel()
            logger.warning("Remote tier %s did not close cleanly: %s", self._where(), exc)

    def __str__(self) -> str:
        return "RemoteBackend"


def create_remote_backends(
    config: LMCacheEngineConfig,
    metadata: LMCacheMetadata,
    loop: asyncio.AbstractEventLoop,
    local_cpu_backend: LocalCPUBackend | None,
    dst_device: str = "cpu",
) -> dict[str, ECRemoteBackend]:
    """The remote tiers of ``config``, named as LMCache names them.

    ``remote_url`` (a store of ``remote_names.STORES``; or else the first plugin)
    becomes ``RemoteBackend``, tier ``remote``; every other remote storage
    plugin becomes ``RemoteBackend-<plugin>``.
    Empty when no remote is configured. An unreachable store does not fail
    here: the backend starts and reports misses until it reconnects.
    """
    settings = from_lmcache(config).remote
    plugins = list(settings.plugins)
    primary: str | None = None
    if settings.url is None:
        if not plugins:
            return {}
        primary = plugins.pop(0)
    backends = {
        "RemoteBackend": ECRemoteBackend(
            config, metadata, loop, local_cpu_backend, dst_device, primary, settings
        )
    }
    for plugin in plugins:
        backend = ECRemoteBackend(
            config, metadata, loop, local_cpu_backend, dst_device, plugin, settings
        )
        backend.backend_name, backend.name = f"RemoteBackend-{plugin}", plugin
        backends[backend.backend_name] = backend
    return backends
