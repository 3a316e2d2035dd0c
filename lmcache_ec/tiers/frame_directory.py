"""A tier that keeps frames as files in one directory shared by processes.

The disk tier (``local_disk.py``) and the node tier (``node.py``) are this
class on two directories. It implements LMCache's ``StorageBackendInterface``
(what ``StorageManager`` calls: ``contains``, ``batched_submit_put_task``,
``get_blocking``, ``remove``, ``get_allocator_backend``, ``close``…) and the
``Tier`` contract, and keeps no private index: the directory is the index, so
every process sees every other's writes, evictions and purges at once
(``contains`` is one ``stat``), and a restart finds everything.

- Layout, atomic writes, temp files, recency: ``disk_layout.py``.
- One size limit for the directory, kept by every process: ``budget.py``.
- No exception from I/O: failed reads and writes are counted (``snapshot()``)
  and logged once an episode (until a read, or a write, succeeds again), a
  vanished file is a miss, a directory deleted under a running engine is
  created again by the next write. A directory that cannot be made or listed
  at start is the one exception: ``RuntimeDirUnavailable``, and the engine
  runs without the tier (``manager.py``).
- An entry name holding what no read can serve (a FIFO, socket, symlink or
  directory; a file this process may not read) is a miss, counted
  (``damaged``) and removed, so that the next put of the key writes a good
  one; a read never waits on it. A file larger than the tier's limit is no
  entry this process could have written: a miss before anything is allocated
  (``read_skipped_too_large``), left for processes with a larger limit.
- In a tier whose directory is private (``entries_owned``: the node tier),
  an entry another user owns is damaged too: after the directory was deleted
  another local user may have made the path again and put well-formed frames
  there (the checksums are no secret). ``contains`` says no to it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import torch
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface

from ..codec import PREFIX_SIZE, CorruptEntryError, FrameRead, check_stored_size
from ..key import ECKey
from ..runtime_dirs import DEFAULT_BASE, Reason, RuntimeDirUnavailable, owner_of
from ..tier_contract import TierDefaults
from .budget import DirectoryBudget, Trimmed
from .disk_layout import (
    PRIVATE,
    DirectoryLayout,
    DirectoryModes,
    make_directory,
    open_entry,
    read_frame,
)

logger = logging.getLogger(__name__)


SEEN_MAX = 1 << 16


def _warn_if_open(path: str, modes: DirectoryModes) -> None:
    """Log a directory (made earlier, or by someone else) that lets more users
    in than ``modes``, or fewer than group sharing needs."""
    with contextlib.suppress(OSError):
        mode = os.stat(path).st_mode & 0o7777
        if modes.group_shared and mode & 0o2070 != 0o2070:  # made private before
            logger.warning(
                "Directory %s has mode %04o: users of its group cannot share it "
                "(local_disk_group_shared) until its owner runs chgrp <group> and "
                "chmod %04o on it",
                path,
                mode,
                modes.directory,
            )
        if mode & ~modes.directory & 0o077:
            logger.warning(
                "Directory %s has mode %04o: other users can read its entries "
                "(stored embeddings can reveal image content); chmod it to %04o",
                path,
                mode,
                modes.directory & 0o777,
            )


class FrameDirectoryTier(TierDefaults, StorageBackendInterface):
    # Reads for the caller go through get_frame (no CPU-pool buffer);
    # read_into_pool serves promotion and LMCache's get_blocking.
    reads_frames = True
    capped_by_free_space = False  # also held to the filesystem's free space (budget.py)
    entries_owned = False  # only this user's files are entries (not so in a group-shared one)

    def __init__(
        self,
        path: str,
        limit: int,
        min_residency: float,
        local_cpu_backend: Any,
        dst_device: str,
        node_dir: str = DEFAULT_BASE,
        modes: DirectoryModes = PRIVATE,
    ) -> None:
        super().__init__(dst_device)
        self.path = path
        self.modes = modes
        self._open_directory()
        _warn_if_open(path, modes)
        self.max_cache_size = limit
        self.layout = DirectoryLayout(path, modes)
        self.budget = DirectoryBudget(
            self.layout,
            limit,
            min_residency,
            node_dir,
            capped_by_free_space=self.capped_by_free_space,
        )
        self.local_cpu_backend = local_cpu_backend
        self.counters: Counter[str] = Counter()
        self._last_write_ok = True
        self._had_room = True  # no-room episodes are logged once each
        self._reads_ok = True  # so are episodes of failed reads and damaged entries
        self._in_flight: set[ECKey] = set()
        self._seen: set[ECKey] = set()  # entries known to exist, to count vanished ones
        self._flight_lock = threading.Lock()
        try:
            trimmed = self.budget.trim()
        except OSError as exc:  # e.g. no room for the ledger: writes will say so too
            trimmed = Trimmed(0, len(self.layout.scan(reclaim=False).entries))
            logger.warning("%s tier %s: size check at start failed: %s", self.name, path, exc)  # type: ignore[attr-defined]
        if trimmed.kept or trimmed.evicted:
            logger.info(
                "%s tier %s: %d entries (%d evicted to fit %d bytes)",
                self.name,  # type: ignore[attr-defined]
                path,
                trimmed.kept,
                trimmed.evicted,
                limit,
            )

    def _open_directory(self) -> None:
        """Make the directory if missing and list it once, before anything else
        touches it; ``RuntimeDirUnavailable`` (``UNUSABLE``, naming the path and
        why) where this process cannot, so the engine starts without the tier
        (``manager.py``) rather than not at all."""
        try:
            self._make_directory()
            with os.scandir(self.path):
                pass  # opening it is the check: another user's 0700 directory fails here
        except RuntimeDirUnavailable:
            raise
        except OSError as exc:
            raise RuntimeDirUnavailable(
                self.path, Reason.UNUSABLE, detail=exc.strerror or str(exc)
            ) from None

    def _make_directory(self) -> None:
        """Make the directory, and its parents, if missing (with ``self.modes``)."""
        make_directory(self.path, self.modes)

    # -- health --------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Health and counters, for stats exporters; ``failures`` are I/O errors."""
        counters = dict(self.counters)
        failures = sum(counters.get(n, 0) for n in ("write_errors", "read_errors", "remove_errors"))
        return {"available": self._last_write_ok, **counters, "failures": failures}

    def pending_writes(self) -> int:
        with self._flight_lock:
            return len(self._in_flight)

    def writes_in_flight(self) -> frozenset[ECKey]:
        with self._flight_lock:
            return frozenset(self._in_flight)

    # -- lookups -------------------------------------------------------------

    def path_of(self, key: ECKey) -> str:
        return self.layout.path_of(key.to_string())

    _key_to_path = path_of  # LMCache's name for it

    def contains(self, key: ECKey, pin: bool = False) -> bool:
        if not self.entries_owned:
            return os.path.exists(self.path_of(key))
        try:
            return os.stat(self.path_of(key)).st_uid == os.getuid()
        except OSError:
            return False

    def exists_in_put_tasks(self, key: ECKey) -> bool:
        with self._flight_lock:
            return key in self._in_flight

    def entries(self) -> list[tuple[ECKey, int, str]]:
        """(key, bytes, path) of every entry, least recently used first."""
        return [(ECKey(e.name), e.size, e.path) for e in self.layout.scan(reclaim=False).entries]

    @property
    def directory(self) -> str:
        return self.layout.path

    def pin(self, key: ECKey) -> bool:
        return False

    def unpin(self, key: ECKey) -> bool:
        return False

    def touch_cache(self) -> None:
        return None

    def get_allocator_backend(self) -> Any:
        return self.local_cpu_backend

    # -- reads ---------------------------------------------------------------

    def read(self, key: ECKey) -> FrameRead | None:
        return self.get_frame(key)

    def _open(self, key: ECKey, path: str) -> int | None:
        """A read-only descriptor of the entry's regular file; None for a miss:
        no entry, one no read can serve (removed: ``_unservable``), one too
        large for this tier, or an I/O error (each counted)."""
        try:
            fd, info = open_entry(path)
        except CorruptEntryError as exc:  # no regular file
            self._unservable(key, path, exc.reason)
            return None
        except OSError as exc:
            self._open_failed(key, path, exc)
            return None
        if self.entries_owned and info.st_uid != os.getuid():  # of the file read, not the path
            os.close(fd)
            self._unservable(key, path, f"owned by {owner_of(info.st_uid)}, not this user")
            return None
        if self._too_large(path, info.st_size):
            os.close(fd)
            return None
        return fd

    def _open_failed(self, key: ECKey, path: str, exc: OSError) -> None:
        if isinstance(exc, FileNotFoundError):
            if key in self._seen:  # deleted under us (purge, rm, another's eviction)
                self._seen.discard(key)
                self.counters["vanished"] += 1
        elif isinstance(exc, PermissionError):  # another user's file, in a directory of ours
            self._unservable(key, path, f"not readable by this process ({exc.strerror})")
        else:
            self._read_failed(path, exc)

    def _too_large(self, path: str, size: int) -> bool:
        """A file larger than this tier's limit: no entry this process could
        write, so a miss before anything is allocated for it; left in place (a
        process with a larger limit may have written it; eviction ages it out)."""
        if size <= self.max_cache_size:
            return False
        self.counters["read_skipped_too_large"] += 1
        self._read_trouble(
            "%s tier: %s holds %d bytes, more than the tier's limit (%d): a miss",
            self.name,  # type: ignore[attr-defined]
            path,
            size,
            self.max_cache_size,
        )
        return True

    def _unservable(self, key: ECKey, path: str, why: str) -> None:
        """An entry no read can serve: a miss, counted and removed (the
        directory's owner can remove another user's file), so that the next
        put of the key writes one that serves rather than being skipped as
        existing."""
        self.counters["damaged"] += 1
        try:
            if not self.budget.remove(key.to_string()):  # it subtracts what it removes
                self.layout.remove(path)  # a dangling symlink, which it cannot stat
            outcome = "removed"
        except OSError as exc:
            self.counters["remove_errors"] += 1
            outcome = f"cannot be removed ({exc.strerror or exc})"
        self._read_trouble(
            "%s tier: entry %s is %s: a miss, %s",
            self.name,  # type: ignore[attr-defined]
            path,
            why,
            outcome,
        )

    def _read_failed(self, path: str, exc: OSError) -> None:
        self.counters["read_errors"] += 1
        self._read_trouble("%s read of %s failed: %s", self.name, path, exc)  # type: ignore[attr-defined]

    def _read_trouble(self, message: str, *args: object) -> None:
        """Log a failed read or damaged entry if it starts an episode (one line,
        not one per read: an entry that cannot be removed is met at every read
        of it); the episode ends when a read succeeds."""
        if self._reads_ok:
            self._reads_ok = False
            logger.warning(message + "; more are counted, not logged, until a read succeeds", *args)

    def get_frame(self, key: ECKey) -> FrameRead | None:
        """The entry read whole into fresh memory, its payload hashed as it lands."""
        path = self.path_of(key)
        fd = self._open(key, path)
        if fd is None:
            return None
        try:
            read = read_frame(fd, os.fstat(fd).st_size)
            self._used(key, fd)  # through the descriptor: no second path lookup
        except OSError as exc:
            self._read_failed(path, exc)
            return None
        finally:
            os.close(fd)
        return read

    def get_blocking(self, key: ECKey) -> MemoryObj | None:
        return self.read_into_pool(key, self._pool_buffer)

    def _pool_buffer(self, size: int) -> MemoryObj | None:
        return self.local_cpu_backend.allocate(
            torch.Size([size]), torch.uint8, MemoryFormat.EC_TD, busy_loop=False
        )

    def read_into_pool(
        self, key: ECKey, allocate: Callable[[int], MemoryObj | None]
    ) -> MemoryObj | None:
        """The entry read into a CPU-pool buffer from ``allocate(size)``, sized
        from the frame's declared length; None for a miss, a damaged entry
        (counted: the next read of it drops it) or a full pool."""
        path = self.path_of(key)
        fd = self._open(key, path)
        if fd is None:
            return None
        try:
            with open(fd, "rb", closefd=True) as stream:
                size = os.fstat(stream.fileno()).st_size
                prefix = os.pread(stream.fileno(), PREFIX_SIZE, 0)
                try:
                    size = check_stored_size(prefix, size)
                except CorruptEntryError:
                    self.counters["damaged"] += 1
                    return None
                memory_obj = allocate(size)
                if memory_obj is None:
                    self.counters["read_skipped_no_memory"] += 1
                    return None
                try:
                    read = stream.readinto(memory_obj.byte_array[:size])
                except OSError:
                    memory_obj.ref_count_down()
                    raise
        except OSError as exc:
            self._read_failed(path, exc)
            return None
        if read < size:
            # Truncated under us: a deterministic tail the checksum rejects.
            memory_obj.tensor[read:] = 0
        self._used(key, path)
        return memory_obj

    def _used(self, key: ECKey, entry: str | int) -> None:
        """A read of ``key``: its entry (path or open descriptor) stamped used now."""
        self.layout.touch(entry)
        self._remember(key)
        self._reads_ok = True

    def _remember(self, key: ECKey) -> None:
        if len(self._seen) >= SEEN_MAX:
            self._seen.clear()  # only the "vanished" count is approximate then
        self._seen.add(key)

    # -- writes --------------------------------------------------------------

    def batched_submit_put_task(
        self,
        keys: Sequence[ECKey],
        memory_objs: Sequence[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[ECKey], None] | None = None,
    ) -> None:
        for key, memory_obj in zip(keys, memory_objs, strict=True):
            self.submit_put_task(key, memory_obj, on_complete_callback)

    def submit_put_task(
        self,
        key: ECKey,
        memory_obj: MemoryObj,
        on_complete_callback: Callable[[ECKey], None] | None = None,
    ) -> None:
        if memory_obj.get_size() > self.max_cache_size:
            self.counters["skipped_too_large"] += 1
            return
        with self._flight_lock:
            if key in self._in_flight:
                return
            self._in_flight.add(key)
        if self.contains(key):
            # The same key is the same encoder output: another process (or an
            # earlier run) wrote it already.
            self.counters["skipped_existing"] += 1
            self._landed(key)
            return
        memory_obj.ref_count_up()  # released by write_entry
        if not self._dispatch(key, memory_obj, on_complete_callback):
            memory_obj.ref_count_down()
            self._landed(key)

    def _dispatch(
        self, key: ECKey, memory_obj: MemoryObj, callback: Callable[[ECKey], None] | None
    ) -> bool:
        """Run ``write_entry`` (here, or on a writer thread); False if refused."""
        self.write_entry(key, memory_obj, callback)
        return True

    def _landed(self, key: ECKey) -> None:
        with self._flight_lock:
            self._in_flight.discard(key)

    def _open_tmp(self, temp: str) -> BinaryIO:
        try:
            return self.layout.open_temp(temp)
        except FileNotFoundError:
            self._recreate()
            return self.layout.open_temp(temp)

    def _recreate(self) -> None:
        # Deleted under us (rm -rf, a cleanup job): make it again rather than
        # failing every later write until a restart.
        self._make_directory()
        self.budget.directory_changed()
        self.counters["dir_recreated"] += 1
        logger.warning("%s tier directory %s was missing; created it again", self.name, self.path)  # type: ignore[attr-defined]

    def _reserve(self, name: str, size: int) -> str | None:
        try:
            return self.budget.reserve(name, size)
        except FileNotFoundError:
            self._recreate()
            return self.budget.reserve(name, size)

    def write_entry(
        self, key: ECKey, memory_obj: MemoryObj, callback: Callable[[ECKey], None] | None
    ) -> None:
        """Reserve room, write, publish; every failure is counted, none raised."""
        name = key.to_string()
        size = memory_obj.get_size()  # the frame's bytes, as the file will hold them
        try:
            try:
                written = self._reserve_and_write(name, memory_obj.byte_array, size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC or not self.budget.capped_by_free_space:
                    raise
                # Filled by others since the reservation's check of free space
                # (its blocks are taken at once, budget.py): this time it evicts.
                self.counters["full_retries"] += 1
                written = self._reserve_and_write(name, memory_obj.byte_array, size)
            if written is None:
                self.counters["skipped_no_room"] += 1
                if self._had_room:
                    self._had_room = False
                    logger.warning(
                        "%s tier %s is full (limit %d bytes%s): new entries are skipped "
                        "until older ones can be evicted",
                        self.name,  # type: ignore[attr-defined]
                        self.path,
                        self.max_cache_size,
                        ", or its filesystem" if self.capped_by_free_space else "",
                    )
                return
            self._had_room = True
            if written:
                self.budget.wrote(name)
                self._remember(key)
            else:
                self.counters["skipped_existing"] += 1
        except OSError as exc:
            self.counters["write_errors"] += 1
            if self._last_write_ok:  # one line per episode, not per write (a full disk)
                logger.warning(
                    "%s write of %s failed: %s; more are counted, not logged, until a write "
                    "succeeds",
                    self.name,  # type: ignore[attr-defined]
                    name,
                    exc,
                )
            self._last_write_ok = False
            return
        finally:
            memory_obj.ref_count_down()
            self._landed(key)
        self._last_write_ok = True
        if callback is not None:
            try:
                callback(key)
            except Exception as exc:
                logger.warning("on_complete_callback failed for %s: %s", key, exc)

    def _reserve_and_write(self, name: str, buffer: Any, size: int) -> bool | None:
        """Publish ``buffer`` as entry ``name`` within the budget: True if written,
        False if the entry existed, None if there is no room. Raises ``OSError``
        with the reservation given back and no temp file left."""
        temp = self._reserve(name, size)
        if temp is None:
            return None
        try:
            published = self.layout.write(name, buffer, self._open_tmp, temp)
        except BaseException:
            self.budget.give_back(temp, size)
            raise
        if not published:
            self.budget.give_back(temp, size)
        return published

    def remove(self, key: ECKey, force: bool = True) -> bool:
        name = key.to_string()
        try:
            # False: not there, or another process removed it first.
            return self.budget.remove(name)
        except OSError as exc:
            self.counters["remove_errors"] += 1
            logger.warning("%s removal of %s failed: %s", self.name, key, exc)  # type: ignore[attr-defined]
            return False

    def close(self) -> None:
        return None
