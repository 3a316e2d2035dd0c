"""The StorageManager of the encoder tier.

LMCache's ``CreateStorageBackends`` fixes the hierarchy
(LocalCPU → LocalDisk → remote → plugins). This subclass builds the first
three from lmcache-ec's subclasses (the remote ones from ``remote_url`` and
remote storage plugins, see ``lmcache_ec.remote.backend``) and leaves the
rest — storage plugins — to upstream, in upstream's order.

``tiers()`` is what the rest of lmcache-ec sees: the tiers in that order,
each a ``Tier`` (``tier_contract.py``); upstream's plugins are wrapped in
``PluginTier``. Backend names (LMCache's keys) are known here only.

A node tier this user can have no private directory for, and a disk tier
whose directory cannot be made or listed at start, are left out (one warning
each); ``features_off()`` says so (``node_tier``, ``disk_tier``), and whether
a directory tier's size ledger is this process's own (``budget.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

from lmcache import torch_device_type
from lmcache.v1.storage_backend import is_cuda_worker
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.storage_manager import StorageManager

from ..config import from_lmcache
from ..runtime_dirs import Feature, RuntimeDirUnavailable, feature_off
from ..tier_contract import Tier, TierDefaults, TierKind
from ..tiers.allocator import allocating_from_pool
from ..tiers.frame_directory import FrameDirectoryTier
from ..tiers.local_cpu import ECLocalCPUBackend
from ..tiers.local_disk import ECLocalDiskBackend
from ..tiers.node import ECNodeBackend

logger = logging.getLogger(__name__)


class _NoControllerFilter(logging.Filter):
    """The encoder tier runs without LMCache's cache controller by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Controller message sender is not initialized" not in record.getMessage()


class _PoolFullFilter(logging.Filter):
    """LMCache warns of every allocation a full pool refuses, even one that an
    eviction then serves; the engine counts refused puts (``put_rejected``) and
    logs a full pool once. LMCache's own pools (a KV cache in the process) keep
    their warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            allocating_from_pool() and "because no memory is available" in record.getMessage()
        )


for _name in ("local_cpu_backend", "local_disk_backend"):
    logging.getLogger(f"lmcache.v1.storage_backend.{_name}").addFilter(_NoControllerFilter())
logging.getLogger("lmcache.v1.memory_management").addFilter(_PoolFullFilter())

CPU_BACKEND = "LocalCPUBackend"
DISK_BACKEND = "LocalDiskBackend"
NODE_BACKEND = "NodeBackend"
REMOTE_BACKEND = "RemoteBackend"
DISK_TIER_OFF = "disk_tier"  # its features_off name (not a runtime_dirs.Feature)
TIER_NAMES = {
    CPU_BACKEND: "cpu",
    NODE_BACKEND: "node",
    DISK_BACKEND: "disk",
    REMOTE_BACKEND: "remote",
}


def tier_name(backend_name: str) -> str:
    """The short tier name users see (``cpu``, ``disk``, ``remote``, plugin names)."""
    if backend_name in TIER_NAMES:
        return TIER_NAMES[backend_name]
    return backend_name.removeprefix("RemoteBackend-")


class PluginTier(TierDefaults):
    """A storage plugin LMCache builds after our tiers, seen through LMCache's
    public ``StorageBackendInterface`` (frames come back as pool buffers)."""

    kind = TierKind.PLUGIN

    def __init__(self, backend_name: str, backend: StorageBackendInterface) -> None:
        self.backend = backend
        self.backend_name = backend_name
        self.name = tier_name(backend_name)
        self.counters: Counter[str] = Counter()
        self.on_recovered: Callable[[], None] | None = None

    def contains(self, key: Any, pin: bool = False) -> bool:
        return self.backend.contains(key, pin)

    def read(self, key: Any) -> Any:
        return self.backend.get_blocking(key)

    def write(self, key: Any, memory_obj: Any) -> None:
        self.backend.batched_submit_put_task([key], [memory_obj])

    def remove(self, key: Any, force: bool = True) -> bool:
        return self.backend.remove(key, force)

    def close(self) -> None:
        self.backend.close()


_unclosed: weakref.WeakSet[ECStorageManager] = weakref.WeakSet()
_exit_watch_lock = threading.Lock()
_exit_watch: threading.Thread | None = None


def _stop_loops_at_exit(manager: ECStorageManager) -> None:
    """LMCache's event-loop thread is not a daemon, so a cache the program never
    closed would keep the interpreter from exiting. One watcher stops those loops
    once the main thread and every other non-daemon thread have finished."""
    global _exit_watch
    _unclosed.add(manager)
    with _exit_watch_lock:
        if _exit_watch is None:
            watch = threading.Thread(target=_watch_exit, name="ec-exit-watch", daemon=True)
            watch.start()
            _exit_watch = watch


def _forget_exit_watch() -> None:
    # A forked child has neither the watcher thread nor its parent's loops.
    global _exit_watch
    _exit_watch = None
    _unclosed.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_exit_watch)


def _watch_exit() -> None:
    threading.main_thread().join()
    while True:
        loops = {getattr(manager, "thread", None) for manager in list(_unclosed)}
        waiting = [
            thread
            for thread in threading.enumerate()
            if not thread.daemon and thread not in loops and thread is not threading.main_thread()
        ]
        if not waiting:
            break
        waiting[0].join()
    for manager in list(_unclosed):
        manager.warn_unwritten()
        with contextlib.suppress(Exception):  # closed already: its loop is gone
            manager.loop.call_soon_threadsafe(manager.loop.stop)


class ECStorageManager(StorageManager):
    _tier_of: dict[str, tuple[Any, Tier]]  # backend name -> (backend, its Tier)

    @property
    def cpu(self) -> ECLocalCPUBackend:
        """The CPU tier: also the pool every frame buffer comes from."""
        cpu = self.storage_backends[CPU_BACKEND]
        assert isinstance(cpu, ECLocalCPUBackend)
        return cpu

    @property
    def disk(self) -> ECLocalDiskBackend | None:
        disk = self.storage_backends.get(DISK_BACKEND)
        return disk if isinstance(disk, ECLocalDiskBackend) else None

    @property
    def node(self) -> ECNodeBackend | None:
        node = self.storage_backends.get(NODE_BACKEND)
        return node if isinstance(node, ECNodeBackend) else None

    def _setup_metrics(self) -> None:
        # As ECLocalCPUBackend's: upstream's gauges would keep a closed cache alive.
        pass

    def tiers(self) -> list[Tier]:
        """The tiers a read walks, in hierarchy order: built, not bypassed or
        frozen by LMCache, and holding entries (the CPU tier not when
        ``local_cpu`` is off: its pool then only lends buffers)."""
        return [
            self._tier(name, backend)
            for name, backend in self.get_active_storage_backends()
            if name != CPU_BACKEND or backend.holds_entries
        ]

    def every_tier(self) -> list[Tier]:
        """Every tier built, in hierarchy order (removal, flushing, purges, stats)."""
        return [self._tier(name, backend) for name, backend in self.storage_backends.items()]

    def _tier(self, name: str, backend: Any) -> Tier:
        # Not set in __init__: StorageManager.__init__ builds the tiers first.
        cache = self.__dict__.setdefault("_tier_of", {})
        known = cache.get(name)
        if known is not None and known[0] is backend:
            return known[1]
        tier = backend if isinstance(backend, TierDefaults) else PluginTier(name, backend)
        cache[name] = (backend, tier)
        return tier

    def features_off(self) -> dict[str, str]:
        """Features off for want of a private runtime directory, and the disk
        tier for want of a usable directory: name -> reason."""
        off = {f.value: r.value for f, r in self.__dict__.get("_features_off", {}).items()}
        off.update(self.__dict__.get("_tiers_off", {}))
        for backend in self.storage_backends.values():
            if isinstance(backend, FrameDirectoryTier) and backend.budget.unshared is not None:
                off[Feature.SHARED_LEDGER.value] = backend.budget.unshared.reason.value
        return off

    def close(self) -> None:
        super().close()
        self.closed = True  # its writes were flushed, or counted by ECCache.close

    def warn_unwritten(self) -> None:
        """At exit, never closed: say how many accepted writes die with the process
        (the tiers' writer threads are daemons)."""
        if self.__dict__.get("closed"):
            return
        with contextlib.suppress(Exception):  # a tier half built or torn down
            lost = sum(tier.pending_writes() for tier in self.every_tier())
            if lost:
                logger.warning(
                    "Exiting with %d accepted writes not yet on every tier: lost (close() "
                    "or a `with` block waits for them, at most close_timeout)",
                    lost,
                )

    def create_backends(self) -> dict[str, str]:
        try:
            created = self._create_backends()
            _stop_loops_at_exit(self)
        except BaseException:
            _unclosed.discard(self)
            self._stop_loop()
            raise
        return created

    def _stop_loop(self) -> None:
        # StorageManager starts its (non-daemon) event-loop thread before the
        # backends; if one fails to build (a storage plugin that raises), nobody
        # would ever close it and the process could not exit.
        for backend in list(self.storage_backends.values()):
            with contextlib.suppress(Exception):
                backend.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    def _create_backends(self) -> dict[str, str]:
        created: dict[str, str] = {}
        dst_device = torch_device_type if is_cuda_worker(self.metadata) else "cpu"
        settings = from_lmcache(self.config)
        with self.manager_lock:
            cpu = self.storage_backends.get(CPU_BACKEND)
            if cpu is None:
                cpu = ECLocalCPUBackend(self.config, self.metadata, dst_device)
                self.storage_backends[CPU_BACKEND] = cpu
                created[CPU_BACKEND] = type(cpu).__name__
            if settings.node_tier and NODE_BACKEND not in self.storage_backends:
                node = self._node_tier(cpu, dst_device)
                if node is not None:
                    # One host copy per node (node.py): the shared tier holds
                    # the entries; the private pool only stages transfers.
                    cpu.use_hot = False
                    self.storage_backends[NODE_BACKEND] = node
                    created[NODE_BACKEND] = type(node).__name__
            if settings.local_disk and DISK_BACKEND not in self.storage_backends:
                disk = self._disk_tier(cpu, dst_device)
                if disk is not None:
                    self.storage_backends[DISK_BACKEND] = disk
                    created[DISK_BACKEND] = type(disk).__name__
            if settings.remote.configured and not any(
                name.startswith(REMOTE_BACKEND) for name in self.storage_backends
            ):
                # Bounded, self-healing remote tiers; upstream then skips its own.
                # Imported only then: no remote tier, no redis or boto3 import.
                from ..remote.backend import create_remote_backends

                remotes = create_remote_backends(
                    self.config, self.metadata, self.loop, cpu, dst_device
                )
                self.storage_backends.update(remotes)
                created.update({name: type(b).__name__ for name, b in remotes.items()})
        if DISK_TIER_OFF in self.__dict__.get("_tiers_off", {}):
            # Upstream builds its own LocalDiskBackend wherever local_disk is set
            # and none exists: with ours off, it must not take its place.
            local_disk, self.config.local_disk = self.config.local_disk, None
            try:
                created.update(super().create_backends())
            finally:
                self.config.local_disk = local_disk
        else:
            created.update(super().create_backends())
        return created

    def _disk_tier(self, cpu: ECLocalCPUBackend, dst_device: str) -> ECLocalDiskBackend | None:
        """The disk tier, or None where its directory cannot be made or listed
        (another user's, under a path that cannot be created, not a directory)."""
        try:
            return ECLocalDiskBackend(self.config, self.loop, cpu, dst_device, None, self.metadata)
        except RuntimeDirUnavailable as exc:
            # A cache that cannot start its disk tier still serves from the others.
            logger.warning(
                "%s off: %s. The engine runs without the disk tier: entries are kept "
                "in the other tiers only",
                DISK_TIER_OFF,
                exc,
            )
            self.__dict__.setdefault("_tiers_off", {})[DISK_TIER_OFF] = exc.reason.value
            return None

    def _node_tier(self, cpu: ECLocalCPUBackend, dst_device: str) -> ECNodeBackend | None:
        """The node tier, or None where this user can have no directory for it."""
        try:
            return ECNodeBackend(self.config, cpu, dst_device)
        except RuntimeDirUnavailable as exc:
            feature_off(
                Feature.NODE_TIER,
                exc,
                "The engine runs without the node tier: each process keeps its entries "
                "in its own CPU tier",
            )
            self.__dict__.setdefault("_features_off", {})[Feature.NODE_TIER] = exc.reason
            return None
