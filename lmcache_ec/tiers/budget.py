"""One size limit per directory, kept by every process that writes to it.

Accounting is a ledger file (the bytes in use, decimal) read and rewritten
under an ``flock`` on itself. It lives in this user's node-local runtime
directory (``runtime_dirs.py``: ``<user dir>/ledgers``, under ``node_dir``),
named by the directory's device and inode (looked up again at every lock,
so a directory made again moves every process to its new ledger), so the
directory holds nothing but entries and every process on the node finds the
same ledger. Where no private runtime directory can be had, the ledger is
this process's own (``ledger_dir``): each process then keeps the limit for
itself, and writes still land. So it is too where the ledger cannot be
written there (``node_dir`` full or read-only, ``LEDGER_FULL``): a fresh
ledger is given its first byte when first locked, so that this shows then,
not at each write, and the budget moves to this process's own ledger for
good (one ``shared_ledger off`` warning naming ``node_dir``), never a disk
tier that stores nothing for want of room on another filesystem.

A group-shared directory (``local_disk_group_shared``) is written by several
users, whose runtime directories are each their own: its ledger is in it
(``GROUP_LEDGER``, mode 0660, never a symlink followed), used only while it
is a regular file of this user's or of the directory's group in a directory
others cannot write. Where it cannot be opened or is no such file, the ledger
is this user's, as for a private directory (one ``shared_ledger off``
warning): each user then keeps the limit for itself.

A writer *reserves* its entry's size and, still under the lock, makes its
temp file, whose name carries that size (a temp file is removed again where
the ledger cannot be written); so the directory (entries plus writes in
progress, each at its reserved size) never holds more than the limit, and a
scan by another process counts a write in progress in full from the start.
A removal, and a reservation given back, deletes its file and subtracts its
bytes under one hold of the lock: a scan by another process between the two
would count the file gone already, and the subtraction would then take its
bytes twice.

The ledger can only over-count (a writer killed after reserving, an entry
deleted by ``purge`` or by hand, a removal that could not have the lock in
time): when a reservation does not fit, the directory is scanned under the
lock, the ledger reset to the truth, and least recently used entries (oldest
mtime; hits refresh it, see ``disk_layout.touch``) evicted down to a
low-water mark, so a full directory is scanned once per ``1 - LOW_WATER`` of
its size written, not per write.

Whose work may go: an entry is evicted only if it was not used for
``min_residency`` seconds, or was written by the evicting process itself.
A process's burst therefore evicts its own oldest entries first and never
takes another process's fresh entries (which that process may be about to
read); a write that finds no such room is skipped (counted), not forced.
Eviction never touches a temp file of a live writer. Crash-safe: the lock
dies with its holder, and a lost reservation is corrected by the next scan.
A holder that keeps the lock (stopped) costs a waiter ``LEDGER_LOCK_WAIT_S``
and an ``OSError`` it handles, never a thread stuck for good.

A directory on a filesystem shared with others (the node tier in
``/dev/shm``, where vLLM's own shared memory lives too) is also held to the
filesystem's real free space (``capped_by_free_space``): a write must leave
``free_reserve`` of the filesystem free (1/16 of it, at most 256 MiB), and
when it would not, entries are evicted as for the limit until it does (plus
the same slack the low-water mark gives), or the write is skipped. There the
temp file is allocated its reserved size under the lock (``posix_fallocate``):
the next writer's look at the free space, in any process, sees the bytes of
every write still in progress, not the empty files they start as (N writers
at once would otherwise each take the same free space, and eat the reserve).
A filesystem filled meanwhile by others fails the allocation (``ENOSPC``),
before anything is written; the tier then evicts and retries once.

The ledger's lock belongs to its open file description, which a forked child
shares: a child closes the descriptor it inherited (``flocks.drop_locks_in_child``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat as stat_mode
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

from ..flocks import close_inherited, drop_locks_in_child, flock_within
from ..runtime_dirs import (
    DEFAULT_BASE,
    Feature,
    Reason,
    RuntimeDirUnavailable,
    feature_off,
    private_dir,
    process_dir,
    state_base,
    user_dir,
)
from .disk_layout import DirectoryLayout, Scan, file_bytes
from .group_ledger import GROUP_LEDGER, open_group_ledger

LEDGER_LOCK_WAIT_S = 5.0


class Trimmed(NamedTuple):
    """What ``DirectoryBudget.trim`` did: entries evicted, and entries kept."""

    evicted: int
    kept: int


LOW_WATER = 15 / 16  # evict down to this share of the limit
BLOCK = 4096  # tmpfs and most filesystems allocate whole pages
FREE_RESERVE_MAX = 256 * 1024**2  # what a capped directory leaves its filesystem's other users
# A ledger nobody wrote for this long belongs to a directory no longer in use
# (or gone); it is removed, and rebuilt by a scan if the directory comes back.
IDLE_LEDGER_S = 24 * 3600
# Why the shared ledger cannot be written where it is: its filesystem's fault, not the directory's.
LEDGER_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
NO_VALUE = b"-"  # a fresh ledger's first byte: reads as none yet (a scan answers)


def prune_ledgers(ledgers: str, idle_s: float = IDLE_LEDGER_S) -> int:
    """Remove ledgers idle for ``idle_s`` (each under its lock, never one in use)."""
    removed = 0
    cutoff = time.time() - idle_s
    with contextlib.suppress(OSError), os.scandir(ledgers) as scan:
        for item in scan:
            with contextlib.suppress(OSError):
                if item.stat().st_mtime >= cutoff:
                    continue
                fd = os.open(item.path, os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    if os.fstat(fd).st_mtime < cutoff:
                        os.unlink(item.path)
                        removed += 1
                finally:
                    os.close(fd)
    return removed


def ledger_dir(node_dir: str = DEFAULT_BASE) -> tuple[str, RuntimeDirUnavailable | None]:
    """Where ledgers live: this user's ``ledgers`` directory on the node, shared
    by its processes; where none can be had, this process's own directory, and
    why. Raises ``OSError`` when neither can be made."""
    try:
        ledgers = private_dir(os.path.join(user_dir(state_base(node_dir)).path, "ledgers"))
    except RuntimeDirUnavailable as exc:
        feature_off(
            Feature.SHARED_LEDGER,
            exc,
            "Each process keeps the disk and node tiers' size limits by itself: a "
            "directory shared by N processes may hold up to N times its limit",
        )
        return process_dir(), exc
    prune_ledgers(ledgers)
    return ledgers, None


def free_reserve(total: int) -> int:
    """Bytes of a ``total``-byte filesystem a capped directory leaves free."""
    return min(total // 16, FREE_RESERVE_MAX)


def on_disk(size: int) -> int:
    """Bytes a ``size``-byte file takes on the filesystem (whole blocks)."""
    return -(-size // BLOCK) * BLOCK


class DirectoryBudget:
    def __init__(
        self,
        layout: DirectoryLayout,
        limit: int,
        min_residency: float,
        node_dir: str = DEFAULT_BASE,
        *,
        capped_by_free_space: bool = False,
    ) -> None:
        self.layout = layout
        self.limit = limit
        self.min_residency = min_residency
        self.node_dir = node_dir  # whose runtime directory holds the ledger
        # Why the ledger is not every sharer's: this process's own, or this
        # user's for a group-shared directory (None: shared, or not opened yet).
        self.unshared: RuntimeDirUnavailable | None = None
        self.capped_by_free_space = capped_by_free_space
        self._own: set[str] = set()  # entries this process wrote
        # A holder keeps the ledger for a scan of the directory at most; past
        # this, a write fails (counted), a start-up trim is put off, a removal
        # deletes its file and leaves its bytes for the next scan to take off.
        self.lock_wait_s = LEDGER_LOCK_WAIT_S
        self._local = threading.Lock()  # flock is per open file, not per thread
        self._fd = -1  # the ledger, while locked
        self._ledger: str | None = None
        self._ledger_of: tuple[int, int] | None = None  # the directory's (dev, inode)
        self._group_of: os.stat_result | None = None  # the directory, if the ledger is in it
        self._shared_in: str | None = None  # the user's ledgers directory, while in it
        # Why the user's ledgers directory cannot take this ledger (its filesystem
        # full or read-only): set once, the ledger is this process's own from then on.
        self._cannot_share: RuntimeDirUnavailable | None = None
        drop_locks_in_child(self)

    def drop_inherited_locks(self) -> None:
        self._fd = close_inherited(self._fd)
        self._local = threading.Lock()

    def _ledger_path(self) -> str:
        """The ledger of the directory now at ``layout.path``. By inode: a
        directory made again (by any process), or a symlink to it swapped, has
        a new ledger, which every process sharing the path moves to at its next
        lock, not only the one that made it. Raises ``OSError`` (no directory)."""
        stat = os.stat(self.layout.path)
        directory = (stat.st_dev, stat.st_ino)
        if self._ledger is None or directory != self._ledger_of:
            self._ledger = self._find_ledger(stat)
            self._ledger_of = directory
        return self._ledger

    def _find_ledger(self, directory: os.stat_result) -> str:
        """Where the ledger of ``directory`` is: in it if it is group-shared (every
        user of the group finds it there), else in this user's ledgers."""
        self._group_of = None
        refused = None
        if self.layout.modes.group_shared:
            path = os.path.join(self.layout.path, GROUP_LEDGER)
            refused = self._group_refusal(path, directory)
            if refused is None:
                self._group_of = directory
                self.unshared = None
                return path
        name = f"{directory.st_dev}-{directory.st_ino}"
        if self._cannot_share is not None:
            self._shared_in = None
            self.unshared = refused or self._cannot_share
            return os.path.join(process_dir(), name)
        ledgers, self.unshared = ledger_dir(self.node_dir)
        self._shared_in = ledgers if self.unshared is None else None
        self.unshared = refused or self.unshared
        return os.path.join(ledgers, name)

    def _stop_sharing(self, exc: OSError) -> bool:
        """The ledger could not be written (or made) in the user's ledgers
        directory for ``exc``: move to this process's own ledger for good (said
        once). False where that is no remedy: another fault, or a ledger that is
        not the shared one (the group's, this process's own already)."""
        if self._shared_in is None or exc.errno not in LEDGER_FULL:
            return False
        state = "read-only" if exc.errno == errno.EROFS else "full"
        base = state_base(self.node_dir)  # the temp directory where node_dir is not writable
        where = f"node_dir {base}" if base == self.node_dir else f"the temp directory {base}"
        self._cannot_share = RuntimeDirUnavailable(
            self._shared_in,
            Reason.UNUSABLE,
            detail=f"{exc.strerror}: the filesystem of {where} is {state}",
        )
        feature_off(
            Feature.SHARED_LEDGER,
            self._cannot_share,
            "Each process keeps the disk and node tiers' size limits by itself: a directory "
            "shared by N processes may hold up to N times its limit; entries still land. "
            "Free room in node_dir and restart the engines to share the limits again",
        )
        self._shared_in = None
        self._ledger = None  # the next lock opens this process's own
        return True

    def _group_refusal(self, path: str, directory: os.stat_result) -> RuntimeDirUnavailable | None:
        """Why the group's ledger ``path`` cannot serve (said once; this user's
        ledger serves instead), None if it can. Raises ``OSError`` (no directory)."""
        try:
            os.close(open_group_ledger(path, directory))
        except OSError as exc:  # RuntimeDirUnavailable among them
            if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
                raise  # no directory (made again by the caller), or a passing fault
            refused = exc if isinstance(exc, RuntimeDirUnavailable) else None
            refused = refused or RuntimeDirUnavailable(
                path, Reason.UNUSABLE, detail=exc.strerror or str(exc)
            )
            feature_off(
                Feature.SHARED_LEDGER,
                refused,
                "Each user keeps this group-shared directory's size limit by itself: "
                "shared by N users, it may hold up to N times its limit",
            )
            return refused
        return None

    def _open_ledger(self) -> int:
        """The ledger of the directory, open (made if missing). Raises ``OSError``."""
        path = self._ledger_path()
        if self._group_of is not None:
            return open_group_ledger(path, self._group_of)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            if not self._stop_sharing(exc):
                raise
        return self._open_ledger()  # this process's own now

    def _room_held(self, fd: int) -> bool:
        """Under the lock: a fresh shared ledger is given its first byte (and so
        its block) now, so that no room for it shows here, not at each write.
        False where there was none: the budget moved to this process's own
        ledger, to be opened instead. Raises ``OSError``."""
        info = os.fstat(fd)
        if self._shared_in is None or info.st_size or not stat_mode.S_ISREG(info.st_mode):
            return True
        try:
            os.pwrite(fd, NO_VALUE, 0)
        except OSError as exc:
            if not self._stop_sharing(exc):
                raise
            return False
        return True

    def directory_changed(self) -> None:
        """The directory was made again: find its ledger anew."""
        self._ledger = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        with self._local:
            while True:
                # In ``self._fd`` from its opening on: a child forked meanwhile closes its copy.
                self._fd = fd = self._open_ledger()
                try:
                    flock_within(fd, self.lock_wait_s, "disk size ledger")
                    # Not pruned while we waited for it, and room for its value.
                    if os.fstat(fd).st_nlink and self._room_held(fd):
                        break
                except OSError:
                    self._release()
                    raise
                self._release()  # else open the new one (or this process's own)
            try:
                yield fd
            finally:
                self._release()

    def _release(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:  # (in a forked child, closed already)
            os.close(fd)  # releases the lock

    def _read(self) -> int | None:
        try:
            return int(os.pread(self._fd, 32, 0))
        except (OSError, ValueError):
            return None  # none yet, or damaged: a scan answers

    def _write(self, used: int) -> None:
        # Under the lock; a torn write reads as damaged and is rescanned.
        data = str(max(used, 0)).encode()
        try:
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
        except OSError as exc:
            self._stop_sharing(exc)  # node_dir full: the next lock takes a ledger of our own
            raise

    def reserve(self, name: str, size: int) -> str | None:
        """Room for a ``size``-byte write of entry ``name``, evicting if needed:
        the temp file to write it in (``DirectoryLayout.write(temp=...)``), or
        None if the limit leaves none. Raises ``OSError`` (directory unusable)."""
        if size > self.limit:
            return None
        with self._locked():
            used = self._read()
            if used is None or used + size > self.limit or self._short_of(size) > 0:
                used = self._make_room(size)
                if used is None:
                    return None
            # Its blocks taken now where free space counts: the next look sees them.
            temp = self.layout.create_temp(name, size, allocate=self.capped_by_free_space)
            try:
                self._write(used + size)
            except OSError:
                # The ledger's filesystem is full: a temp file left would count
                # as a write in progress, at its reserved size, for every scan.
                with contextlib.suppress(OSError):
                    os.remove(temp)
                raise
        return temp

    def wrote(self, name: str) -> None:
        """The reserved entry is published: it is this process's own."""
        self._own.add(name)

    def give_back(self, temp: str, size: int) -> bool:
        """Give back the ``size``-byte reservation of ``temp`` (from ``reserve``:
        the write failed, or another writer published first): the file deleted
        and its bytes subtracted at once. False if the file was gone already or
        could not be deleted (a scan then counts it). Never raises."""
        with contextlib.suppress(OSError):
            return self._delete_and_subtract(temp, size)
        return False

    def remove(self, name: str) -> bool:
        """Delete entry ``name`` and subtract its bytes at once; False if it was
        gone already. Raises ``OSError`` when it cannot be deleted."""
        self._own.discard(name)
        return self._delete_and_subtract(self.layout.path_of(name), None)

    def _delete_and_subtract(self, path: str, size: int | None) -> bool:
        """Delete ``path`` and subtract its ``size`` (None: its size on disk)
        under one hold of the lock. A file already gone subtracts nothing:
        whoever deleted it may have had a scan count it gone (an over-count is
        safe, an under-count is not). Where the lock cannot be had in time the
        file is deleted all the same, its bytes left for the next scan to take
        off. Raises ``OSError`` when the file cannot be deleted."""
        with contextlib.ExitStack() as hold:
            try:
                hold.enter_context(self._locked())
                held = True
            except OSError:
                held = False
            try:
                # As a scan counts it (``disk_layout``): a symlink's target is not ours.
                freed = file_bytes(os.lstat(path)) if size is None else size
                os.remove(path)
            except FileNotFoundError:
                return False
            used = self._read() if held else None
            if used is not None:
                with contextlib.suppress(OSError):  # a torn write reads as damaged
                    self._write(used - freed)
        return True

    def trim(self) -> Trimmed:
        """Evict (LRU) to the limit; at start-up, where the limit may have shrunk.
        Entries used within ``min_residency`` are spared: another process sharing
        the directory (a larger limit, a rolling restart) is still using them.
        How many entries were evicted and kept (from the one scan this takes: a
        large directory is slow to list)."""
        with self._locked():
            scan = self.layout.scan(max_reserved=self.limit)
            used = scan.total
            evicted = 0
            for entry in self._victims(scan):
                if used <= self.limit:
                    break
                try:
                    evicted += self.layout.remove(entry.path)
                except OSError:
                    continue  # read-only: it stays, and counts
                used -= entry.size
            self._write(used)
        return Trimmed(evicted, len(scan.entries) - evicted)

    def _make_room(self, size: int) -> int | None:
        """Under the lock: the true usage after evicting for ``size`` more
        bytes, or None if it cannot fit (the ledger is still corrected)."""
        scan = self.layout.scan(max_reserved=self.limit)
        self._own.intersection_update(e.name for e in scan.entries)  # others evicted some
        used = scan.total
        short = self._short_of(size)
        if used + size <= self.limit and short <= 0:
            return used
        target = min(self.limit - size, int(self.limit * LOW_WATER))
        if short > 0:  # the filesystem is fuller than the limit: free what it lacks, and slack
            short = self._short_of(size, slack=True)
        for entry in self._victims(scan):
            if used <= target and short <= 0:
                break
            try:
                self.layout.remove(entry.path)
            except OSError:
                continue  # read-only: it stays, and counts
            self._own.discard(entry.name)
            used -= entry.size
            short -= on_disk(entry.size)
        if used + size > self.limit or self._short_of(size) > 0:
            self._write(used)
            return None
        return used

    def _short_of(self, size: int, *, slack: bool = False) -> int:
        """Bytes the filesystem lacks for a ``size``-byte write beyond its reserve
        (0 or less: it fits); always 0 for a directory not capped by free space.
        ``slack``: also the room the low-water mark would leave, so that a full
        filesystem is not scanned for every write."""
        if not self.capped_by_free_space:
            return 0
        stat = os.statvfs(self.layout.path)
        total = stat.f_blocks * stat.f_frsize
        free = stat.f_bavail * stat.f_frsize - free_reserve(total)
        extra = int(min(self.limit, total) * (1 - LOW_WATER)) if slack else 0
        return on_disk(size) + extra - free

    def _victims(self, scan: Scan) -> list:
        cutoff = time.time_ns() - int(self.min_residency * 1e9)
        idle = [e for e in scan.entries if e.mtime_ns <= cutoff or e.name in self._own]
        return idle  # already least recently used first

    def clear(self) -> int:
        """Remove every entry (and dead writers' temp files); the number removed."""
        with self._locked():
            scan = self.layout.scan(max_reserved=self.limit)
            used, removed = scan.total, 0
            for entry in scan.entries:
                try:
                    removed += self.layout.remove(entry.path)
                except OSError:
                    continue  # read-only: it stays, and counts
                used -= entry.size
            self._own.clear()
            self._write(used)
        return removed

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the ledger's lock: meanwhile no process reserves or evicts, so
        the directory's bytes (writes at their reserved size) can only shrink."""
        with self._locked():
            yield

    def ledger(self) -> int | None:
        """The bytes the ledger holds now (None: no usable ledger)."""
        with self._locked():
            return self._read()
