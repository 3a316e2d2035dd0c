"""LMCache's LocalDiskBackend, made persistent and crash-safe for encoder outputs.

What upstream lacks, and this subclass adds:

- **Restart persistence.** Upstream keeps shape/dtype only in an in-memory
  index that starts empty, so a new process never sees old files. Entries are
  self-describing frames (``codec.py``) named by their storage name, so the
  index is rebuilt from a directory scan (names and sizes, no reads), oldest
  first so LRU order survives too.
- **Sharing between processes.** A key missing from the index is looked up on
  disk once (one ``stat``), so entries written by another process on the same
  directory are found.
- **Atomic writes.** Upstream writes the final path in place; a crash leaves a
  torn file. Here a frame is written to a temporary name and renamed, so a
  reader sees a whole frame or none. (A torn file from elsewhere still fails
  its checksum and is dropped by the engine.)
- **No exception from I/O.** A failed write is logged and forgotten; a file
  deleted under us is a miss; allocation pressure is a miss, not an assert;
  a file that cannot be removed (read-only directory) stays, unindexed. A
  directory deleted under a running engine is created again by the next
  write. Every such failure is counted (``snapshot()``, shown by ``ECStats``
  under ``tiers.disk`` and in ``tier_errors``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from lmcache.logging import init_logger
from lmcache.utils import CacheEngineKey, DiskCacheMetadata
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.cache_policy.lru import LRUCachePolicy
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

from ..codec import PREFIX_SIZE, FrameParts, read_frame_parts
from ..key import ECKey
from .contract import TierDefaults, TierKind
from .writer import BackgroundWriter

logger = init_logger(__name__)

SUFFIX = ".pt"  # upstream's; the storage name before it identifies the entry
TMP_MARKER = ".tmp-"  # a write in progress: <name>.pt.tmp-<pid>-<thread>


def is_temp_file(name: str) -> bool:
    """A file name of a write in progress (storage names may contain ``.tmp-``)."""
    return SUFFIX + TMP_MARKER in name


def entry_stem(name: str) -> str | None:
    """The storage name of an entry's file name, or None for any other file."""
    if is_temp_file(name) or not name.endswith(SUFFIX):
        return None
    return name[: -len(SUFFIX)]


STALE_TMP_SECONDS = 3600


class ECLocalDiskBackend(TierDefaults, LocalDiskBackend):
    kind = TierKind.DISK
    name = "disk"
    backend_name = "LocalDiskBackend"
    _lru: bool | None = None  # is the policy plain LRU (decided on first use)

    def __init__(self, *args, **kwargs) -> None:
        # Writes run on our own thread (writer.py), not LMCache's loop and pool.
        self._writer = BackgroundWriter("ec-disk-writer")
        super().__init__(*args, **kwargs)
        self.counters: Counter[str] = Counter()
        self._last_write_ok = True
        self.rebuilt_entries = self._rebuild_index()

    @property
    def write_errors(self) -> int:
        return self.counters["write_errors"]

    def snapshot(self) -> dict[str, Any]:
        """Health and counters, for stats exporters; ``failures`` are I/O errors."""
        counters = dict(self.counters)
        failures = sum(counters.get(n, 0) for n in ("write_errors", "read_errors", "remove_errors"))
        return {"available": self._last_write_ok, **counters, "failures": failures}

    # -- index ---------------------------------------------------------------

    def _meta(self, path: str, size: int) -> DiskCacheMetadata:
        return DiskCacheMetadata(
            path, size, torch.Size([size]), torch.uint8, None, MemoryFormat.EC_TD, 0
        )

    def _rebuild_index(self) -> int:
        found: list[tuple[float, ECKey, str, int]] = []
        now = time.time()
        with os.scandir(self.path) as scan:
            for entry in scan:
                name = entry.name
                try:
                    if is_temp_file(name):
                        if now - entry.stat().st_mtime > STALE_TMP_SECONDS:
                            os.remove(entry.path)
                        continue
                    stem = entry_stem(name)
                    if stem is None or not ECKey.is_storage_name(stem):
                        continue
                    stat = entry.stat()
                except OSError:
                    continue  # vanished while scanning
                found.append((stat.st_mtime, ECKey(stem), entry.path, stat.st_size))
        found.sort(key=lambda item: item[0])
        with self.disk_lock:
            for _, key, path, size in found:
                self.dict[key] = self._meta(path, size)
                self.cache_policy.update_on_put(key)
                self.current_cache_size += size
                self.usage += size
        self._evict_to_capacity()
        if found:
            logger.info("Disk tier %s: %d entries indexed", self.path, len(found))
        return len(found)

    def _evict_to_capacity(self) -> None:
        with self.disk_lock:
            while self.current_cache_size > self.max_cache_size and self.dict:
                victims = self.cache_policy.get_evict_candidates(self.dict, 1)
                if not victims:
                    break
                for victim in victims:
                    self.current_cache_size -= self.dict[victim].size
                self.batched_remove(victims, force=False)

    def _adopt(self, key: CacheEngineKey) -> bool:
        """Index an entry another process wrote; False if there is none."""
        path = self._key_to_path(key)
        try:
            size = os.stat(path).st_size
        except OSError:
            return False
        with self.disk_lock:
            if key not in self.dict:
                self.dict[key] = self._meta(path, size)
                self.cache_policy.update_on_put(key)
                self.current_cache_size += size
                self.usage += size
        return True

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        if super().contains(key, pin):
            return True
        return self._adopt(key) and super().contains(key, pin)

    def forget_missing(self) -> int:
        """Unindex entries whose file is gone (removed by another process, e.g.
        ``lmcache-ec purge``), so ``contains`` and writes stop trusting them."""
        gone = [(key, path) for key, _, path in self.entries() if not os.path.exists(path)]
        with self.disk_lock:
            for key, path in gone:
                meta = self.dict.get(key)
                if meta is not None and meta.path == path:
                    del self.dict[key]
                    self.current_cache_size -= meta.size
                    self.usage -= meta.size
        return len(gone)

    def entries(self) -> list[tuple[CacheEngineKey, int, str]]:
        """(key, bytes, path) of every indexed entry, least recently used first."""
        with self.disk_lock:
            return [(k, m.size, m.path) for k, m in self.dict.items()]

    # -- reads ---------------------------------------------------------------

    def _lookup(self, key: CacheEngineKey) -> DiskCacheMetadata | None:
        with self.disk_lock:
            meta = self.dict.get(key)
        if meta is None and self._adopt(key):
            with self.disk_lock:
                meta = self.dict.get(key)
        return meta

    def _touch(self, key: CacheEngineKey) -> None:
        lru = self._lru
        if lru is None:
            self._lru = lru = type(self.cache_policy) is LRUCachePolicy
        with self.disk_lock:
            if key in self.dict:
                if lru:  # LRUCachePolicy.update_on_hit without its KV-chunk statistics
                    self.dict.move_to_end(key)
                else:
                    self.cache_policy.update_on_hit(key, self.dict)

    def _vanished(self, key: CacheEngineKey, meta: DiskCacheMetadata) -> None:
        self.counters["vanished"] += 1
        with self.disk_lock:
            if self.dict.pop(key, None) is not None:
                self.current_cache_size -= meta.size
                self.usage -= meta.size

    # Reads for the caller go through get_frame (fresh memory, no CPU-pool
    # buffer); get_blocking (into the pool) serves promotion and LMCache.
    reads_frames = True

    def read(self, key: CacheEngineKey) -> FrameParts | None:
        return self.get_frame(key)

    def get_frame(self, key: CacheEngineKey) -> FrameParts | None:
        """The entry read into fresh memory: prefix and header, then the payload
        straight into a tensor of its own (no extra copy), hashed as it lands."""
        meta = self._lookup(key)
        if meta is None:
            return None
        try:
            fd = os.open(meta.path, os.O_RDONLY)
        except FileNotFoundError:
            self._vanished(key, meta)
            return None
        except OSError as exc:
            self.counters["read_errors"] += 1
            logger.warning("Disk read of %s failed: %s", meta.path, exc)
            return None
        try:
            parts = read_frame_parts(fd, meta.size)
        except OSError as exc:
            self.counters["read_errors"] += 1
            logger.warning("Disk read of %s failed: %s", meta.path, exc)
            return None
        finally:
            os.close(fd)
        self._touch(key)
        return parts

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        return self.read_into_pool(key, self._pool_buffer)

    def _pool_buffer(self, size: int) -> MemoryObj | None:
        return self.local_cpu_backend.allocate(
            torch.Size([size]), torch.uint8, MemoryFormat.EC_TD, busy_loop=False
        )

    def read_into_pool(
        self, key: CacheEngineKey, allocate: Callable[[int], MemoryObj | None]
    ) -> MemoryObj | None:
        """The entry read into a CPU-pool buffer from ``allocate(size)``."""
        meta = self._lookup(key)
        if meta is None:
            return None
        # At least a frame prefix, so an empty file reads as a corrupt frame.
        memory_obj = allocate(max(meta.size, PREFIX_SIZE))
        if memory_obj is None:
            self.counters["read_skipped_no_memory"] += 1
            logger.warning("CPU pool full: disk read of %s skipped", key)
            return None
        buffer = memory_obj.byte_array
        try:
            with open(meta.path, "rb") as stream:
                read = stream.readinto(buffer)
        except FileNotFoundError:
            memory_obj.ref_count_down()
            self._vanished(key, meta)
            return None
        except OSError as exc:
            memory_obj.ref_count_down()
            self.counters["read_errors"] += 1
            logger.warning("Disk read of %s failed: %s", meta.path, exc)
            return None
        if read < len(buffer):
            # Truncated under us: make the tail deterministic; the frame's
            # checksum then rejects it.
            memory_obj.tensor[read:] = 0
        self._touch(key)
        return memory_obj

    # -- writes --------------------------------------------------------------

    def _open_tmp(self, tmp: str):
        try:
            return open(tmp, "wb")
        except FileNotFoundError:
            # The directory was deleted under us (rm -rf, a cleanup job): make
            # it again rather than failing every later write until a restart.
            os.makedirs(os.path.dirname(tmp), exist_ok=True)
            self.counters["dir_recreated"] += 1
            logger.warning("Disk tier directory %s was missing; created it again", self.path)
            return open(tmp, "wb")

    def write_file(self, buffer, path: str) -> None:
        tmp = f"{path}{TMP_MARKER}{os.getpid()}-{threading.get_ident()}"
        try:
            with self._open_tmp(tmp) as stream:
                stream.write(buffer)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise

    def async_save_bytes_to_disk(
        self,
        key: CacheEngineKey,
        memory_obj: MemoryObj,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> None:
        size = memory_obj.get_physical_size()
        path = self._key_to_path(key)
        try:
            self.write_file(memory_obj.byte_array, path)
        except OSError as exc:
            self.counters["write_errors"] += 1
            self._last_write_ok = False
            logger.warning("Disk write of %s failed: %s", path, exc)
            with self.disk_lock:
                self.current_cache_size -= size
            self.disk_worker.remove_put_task(key)
            return
        finally:
            memory_obj.ref_count_down()
        self._last_write_ok = True
        self.usage += size
        self.insert_key(key, size, torch.Size([size]), torch.uint8, MemoryFormat.EC_TD)
        self.disk_worker.remove_put_task(key)
        if on_complete_callback is not None:
            try:
                on_complete_callback(key)
            except Exception as exc:
                logger.warning("on_complete_callback failed for %s: %s", key, exc)

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        if force:
            # Upstream decrements the size only on its own evictions.
            with self.disk_lock:
                meta = self.dict.get(key)
                if meta is not None:
                    self.current_cache_size -= meta.size
        try:
            return super().remove(key, force)
        except FileNotFoundError:
            return True  # another process removed the file first
        except OSError as exc:
            # Unindexed now; the file stays (read-only directory, I/O error).
            self.counters["remove_errors"] += 1
            logger.warning("Disk removal of %s failed: %s", key, exc)
            return False

    def submit_put_task(
        self,
        key: CacheEngineKey,
        memory_obj: MemoryObj,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> None:
        size = memory_obj.get_physical_size()
        if size > self.max_cache_size:
            self.counters["skipped_too_large"] += 1  # upstream only logs it
        if not self._admit(key, size):
            return
        memory_obj.ref_count_up()  # released by async_save_bytes_to_disk
        if not self._writer.submit(
            self.async_save_bytes_to_disk, key, memory_obj, on_complete_callback
        ):
            memory_obj.ref_count_down()
            with self.disk_lock:
                self.current_cache_size -= size
            self.disk_worker.remove_put_task(key)

    def _admit(self, key: CacheEngineKey, size: int) -> bool:
        """Upstream's admission, as in ``LocalDiskBackend.submit_put_task``: not on
        disk or in flight already, room made by evicting, the size reserved.

        An entry another process wrote under the same name counts as on disk:
        the same key is the same encoder output, so it is not written again."""
        with self.disk_lock:
            indexed = key in self.dict
        if not indexed and self._adopt(key):
            self.counters["skipped_existing"] += 1
            return False
        with self.disk_lock:
            if key in self.dict:
                self.cache_policy.update_on_hit(key, self.dict)
                return False
            if size > self.max_cache_size:
                logger.warning("Put of %s (%d bytes) exceeds the disk tier", key, size)
                return False
            if not self.disk_worker.try_insert_put_task(key):
                return False  # a write of this key is in flight
            excess = self.current_cache_size + size - self.max_cache_size
            if excess > 0 and sum(m.size for m in self.dict.values() if m.can_evict) < excess:
                logger.warning("Not enough evictable disk space for %s", key)
                self.disk_worker.remove_put_task(key)
                return False
            while self.current_cache_size + size > self.max_cache_size:
                victims = self.cache_policy.get_evict_candidates(self.dict, num_candidates=1)
                if not victims:
                    self.disk_worker.remove_put_task(key)
                    return False
                for victim in victims:
                    self.current_cache_size -= self.dict[victim].size
                self.batched_remove(victims, force=False)
            self.current_cache_size += size
            self.cache_policy.update_on_put(key)
            return True

    def close(self) -> None:
        self._writer.close()
        super().close()

    def pending_writes(self) -> int:
        with self.disk_worker.put_lock:
            return len(self.disk_worker.put_tasks)
