"""How a directory of frames is laid out: the one place that knows file names.

Used by the disk and node tiers, the scheduler's index, ``inventory`` and the
CLI. A directory holds:

- entries: ``<storage_name>.pt`` (the suffix is upstream LMCache's), each one
  whole self-verifying frame (``codec.py``);
- writes in progress: ``.tmp-<pid>-<seq>-<reserved>.<storage_name>``. The
  leading dot means no temp name is ever a storage name (those start with
  ``ec``), whatever the model path (``/tmp/models/x`` gives a ``tmp-…`` slug);
  the pid lets any process reclaim a dead writer's leftovers at once; the
  bytes reserved for the write count from the moment the file is made (under
  the budget's lock), so a scan by another process never sees a write in
  progress as smaller than it will be. A name is trusted no further: one
  reserving more than the directory's limit counts at its own size, pids 0
  and 1 are no writer's, and an mtime counts no later than the ctime (an
  mtime can be set to the future, a ctime cannot);
- the purge logs, one per namespace (``purge/marker.py``), which are not entries.

A directory's size ledger (``budget.py``) lives outside it, in this user's
node-local runtime directory (``runtime_dirs.py``), keyed by the directory's
device and inode: every process on the node that shares the directory finds it.
A group-shared directory's ledger is in it (``.ledger``), where every user of
the group finds it; like the purge logs, it is no entry.

Modes: entries, temp files and the purge log are made ``0600`` in a
directory made ``0700`` (stored embeddings can reveal image content); a
directory shared with a group is an explicit setting (``local_disk_group_shared``:
``2770`` and ``0660``, set past the umask). ``DirectoryModes`` carries the choice.

Pids are compared within one pid namespace: processes sharing a directory
from different containers should share it too, or a live writer's temp file
may be reclaimed (its write is then lost, never torn).

Guarantees: a reader sees a whole frame or none (written to a temp name, then
published by ``link`` — never replacing an entry another process wrote — or
by ``rename`` where links are unsupported). A crash leaves at most a temp file,
reclaimed by the next scan. Recency is the file's mtime, set explicitly at
write and on every hit (``touch``), so LRU order is shared by every process;
a hit on another user's entry of a group-shared directory sets it to the
kernel's "now" (setting a given time is for the file's owner alone).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from stat import S_ISREG
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import xxhash

from ..codec import (
    PREFIX_SIZE,
    CorruptEntryError,
    FrameRead,
    check_stored_size,
    parse_header,
    read_prefix,
)
from ..key import ECKey

SUFFIX = ".pt"
TEMP_PREFIX = ".tmp-"
STALE_TEMP_SECONDS = 3600  # a live writer's temp file older than this is abandoned

_seq = itertools.count()
_clock_lock = threading.Lock()
_last_ns = 0


def entry_file(name: str) -> str:
    """The file name of the entry stored under ``name``."""
    return name + SUFFIX


def entry_stem(filename: str) -> str | None:
    """The storage name of an entry's file name, or None for any other file."""
    if not filename.endswith(SUFFIX):
        return None
    stem = filename[: -len(SUFFIX)]
    return stem if ECKey.is_storage_name(stem) else None


def is_temp(filename: str) -> bool:
    return filename.startswith(TEMP_PREFIX)


def _temp_fields(filename: str) -> list[str]:
    return filename[len(TEMP_PREFIX) :].split(".", 1)[0].split("-")


def temp_owner(filename: str) -> int | None:
    """The pid that wrote a temp file, None if the name carries none."""
    try:
        return int(_temp_fields(filename)[0])
    except ValueError:
        return None


def temp_reserved(filename: str) -> int:
    """The bytes reserved for a temp file's write (0 if its name carries none)."""
    fields = _temp_fields(filename)
    try:
        return int(fields[2]) if len(fields) > 2 else 0
    except ValueError:
        return 0


def _alive(pid: int) -> bool:
    if pid <= 1 and pid != os.getpid():
        return False  # kill(0) reaches our own group, and init never dies: says nothing
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, another user's
    return True


def _abandoned(filename: str, stat: os.stat_result, now: float) -> bool:
    """Whether temp file ``filename`` is no live write's: its writer is gone, or
    it has not changed for ``STALE_TEMP_SECONDS``. Its mtime counts no later
    than its ctime, which only the kernel sets: an mtime set years ahead does
    not keep it fresh."""
    owner = temp_owner(filename)
    if owner is None or not _alive(owner):
        return True
    return now - min(stat.st_mtime, stat.st_ctime) > STALE_TEMP_SECONDS


def use_stamp() -> int:
    """A strictly increasing wall-clock stamp (ns) for mtimes: ties would make
    LRU order arbitrary between entries used within one clock tick."""
    global _last_ns
    with _clock_lock:
        _last_ns = max(time.time_ns(), _last_ns + 1)
        return _last_ns


def _open_existing(path: str, _flags: int) -> int:
    # No O_TRUNC: that would free the blocks a reservation allocated (``create_temp``).
    return os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


class DirectoryModes(NamedTuple):
    """The modes a directory of frames and the files in it are made with."""

    directory: int
    file: int

    @property
    def group_shared(self) -> bool:
        """Whether the members of the directory's group use it too."""
        return bool(self.directory & 0o070)

    @classmethod
    def of(cls, group_shared: bool) -> DirectoryModes:
        return cls(0o2770, 0o660) if group_shared else cls(0o700, 0o600)


PRIVATE = DirectoryModes.of(False)


def make_directory(path: str, modes: DirectoryModes = PRIVATE) -> None:
    """``path`` and its parents, the last made with ``modes.directory`` (past the
    umask); an existing directory is left as it is."""
    try:
        os.mkdir(path, modes.directory)
    except FileExistsError:
        return
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            os.mkdir(path, modes.directory)
        except FileExistsError:
            return
    os.chmod(path, modes.directory)  # the umask may have taken group bits


def create_file(path: str, mode: int) -> int:
    """A new file (``O_EXCL``, never following a link) made with ``mode``
    whatever the umask; its descriptor, open for writing."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    if mode & 0o077:
        os.fchmod(fd, mode)  # the umask may have taken group bits
    return fd


def file_bytes(stat: os.stat_result) -> int:
    """What a file (``lstat``) counts in its directory: nothing unless regular."""
    return stat.st_size if S_ISREG(stat.st_mode) else 0


_CANNOT_ALLOCATE = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _allocate(fd: int, size: int) -> None:
    """Take ``size`` bytes of blocks for ``fd`` now; where the filesystem has
    no way to (nor glibc's emulation), the write takes them as it lands."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in _CANNOT_ALLOCATE:
            raise


class Stored(NamedTuple):
    name: str  # storage name
    path: str
    size: int
    mtime_ns: int


class Scan(NamedTuple):
    entries: list[Stored]  # least recently used first
    temp_bytes: int  # writes in progress (live writers)

    @property
    def total(self) -> int:
        return self.temp_bytes + sum(e.size for e in self.entries)


class DirectoryLayout:
    """One directory of frame files."""

    def __init__(self, path: str, modes: DirectoryModes = PRIVATE) -> None:
        self.path = path
        self.modes = modes

    def path_of(self, name: str) -> str:
        """The entry file of storage name ``name``; ``ValueError`` for a name
        that would leave the directory (storage names never do)."""
        if "/" in name or "\0" in name or name.startswith("."):
            raise ValueError(f"not a storage name: {name!r:.80}")
        return os.path.join(self.path, entry_file(name))

    def temp_path(self, name: str, reserved: int = 0) -> str:
        filename = f"{TEMP_PREFIX}{os.getpid()}-{next(_seq)}-{reserved}.{name}"
        return os.path.join(self.path, filename)

    def create_temp(self, name: str, reserved: int, *, allocate: bool = False) -> str:
        """Make the temp file of a write of ``reserved`` bytes; from now on
        every scan counts those bytes. Empty, or with ``allocate`` its blocks
        taken now (the filesystem's free space counts them). Raises ``OSError``
        (``ENOSPC`` where they cannot be had), leaving no file."""
        temp = self.temp_path(name, reserved)
        fd = create_file(temp, self.modes.file)
        try:
            if allocate and reserved > 0:
                _allocate(fd, reserved)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(temp)
            raise
        finally:
            os.close(fd)
        return temp

    def open_new(self, path: str) -> BinaryIO:
        """A new file of this directory (a temp file), open for writing."""
        return open(path, "wb", opener=lambda p, _: create_file(p, self.modes.file))

    def open_temp(self, temp: str) -> BinaryIO:
        """The temp file ``create_temp`` made, open for writing from its start
        (made if gone); ``write`` cuts it to what it wrote."""
        try:
            return open(temp, "wb", opener=_open_existing)
        except FileNotFoundError:
            return self.open_new(temp)

    # -- scanning ------------------------------------------------------------

    def scan(self, *, reclaim: bool = True, max_reserved: int | None = None) -> Scan:
        """Entries by recency and the bytes of live writes (each at least what
        it reserved); a dead writer's temp files (or any unchanged for
        ``STALE_TEMP_SECONDS``) are removed. A name reserving more than
        ``max_reserved`` (the directory's limit: no write reserves more) is no
        write's: the file counts at its own size only. Only a regular file's
        bytes count: anything else under an entry's name (a symlink, whose
        target is outside the directory, a FIFO) is listed at 0 bytes, for a
        read (as damaged), eviction or purge to remove."""
        entries: list[Stored] = []
        entry_inodes: set[int] = set()
        writes: dict[int, int] = {}  # inode -> bytes
        now = time.time()
        for item in self._items():
            name = item.name
            try:
                if is_temp(name):
                    reserved = temp_reserved(name)
                    if max_reserved is not None and reserved > max_reserved:
                        reserved = 0
                    try:
                        stat = item.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        # Published (or given up) since it was listed: its entry
                        # may not be in the listing, so the write counts at its
                        # reservation (an entry listed with its inode counts once).
                        writes[item.inode()] = reserved
                        continue
                    if reclaim and _abandoned(name, stat, now):
                        os.remove(item.path)
                    else:
                        writes[item.inode()] = max(file_bytes(stat), reserved)
                    continue
                stem = entry_stem(name)
                if stem is None:
                    continue
                stat = item.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished while scanning
            entry_inodes.add(item.inode())
            entries.append(Stored(stem, item.path, file_bytes(stat), stat.st_mtime_ns))
        entries.sort(key=lambda e: e.mtime_ns)
        # A write just published by link is its entry too, until its temp name goes.
        temp_bytes = sum(size for inode, size in writes.items() if inode not in entry_inodes)
        return Scan(entries, temp_bytes)

    def names(self, limit: int) -> set[str] | None:
        """Storage names of the entries, without a ``stat`` each; None beyond
        ``limit`` entries (the caller then checks entries one by one)."""
        names: set[str] = set()
        for item in self._items():
            stem = entry_stem(item.name)
            if stem is not None:
                names.add(stem)
                if len(names) > limit:
                    return None
        return names

    def _items(self) -> Iterator[os.DirEntry]:
        try:
            scan = os.scandir(self.path)
        except FileNotFoundError:
            return
        with scan:
            yield from scan

    # -- one entry -----------------------------------------------------------

    def touch(self, entry: str | int) -> None:
        """Mark an entry (its path, or a descriptor open on it) used now, for
        the shared LRU order; a vanished file is ignored."""
        stamp = use_stamp()
        try:
            os.utime(entry, ns=(stamp, stamp))
        except PermissionError:
            # Another user's entry (group-shared): only its owner may set a given
            # time, any user who may write it "now" (the kernel's clock, coarser).
            with contextlib.suppress(OSError):
                os.utime(entry, None)
        except OSError:
            pass  # vanished

    def write(
        self,
        name: str,
        buffer: Any,
        opener: Callable[[str], BinaryIO] | None = None,
        temp: str | None = None,
    ) -> bool:
        """Publish ``buffer`` as entry ``name`` atomically; False if an entry of
        that name already exists (it is left as it is). ``opener(temp_path)``
        opens the temp file for writing. ``temp``, from ``create_temp``, holds
        a reservation: unless published, it is left in place for the budget to
        delete as it subtracts the reservation (``DirectoryBudget.give_back``),
        so that no scan sees it gone and the reservation still counted. Raises
        ``OSError``."""
        reserved = temp is not None
        temp = temp or self.temp_path(name)
        final = self.path_of(name)
        published = False
        try:
            with (opener or self.open_temp)(temp) as stream:
                stream.write(buffer)
                stream.truncate()  # a file allocated longer is cut to the frame
            stamp = use_stamp()
            os.utime(temp, ns=(stamp, stamp))
            try:
                os.link(temp, final)  # never replaces another writer's entry
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                    raise
                os.replace(temp, final)  # no hard links here
            published = True
            return True
        finally:
            if published or not reserved:
                with contextlib.suppress(OSError):
                    os.remove(temp)

    def replace_file(self, filename: str, data: bytes) -> None:
        """Write a non-entry file (``filename``) atomically, replacing any
        previous one; its temp file is reclaimed like an entry's. Raises ``OSError``."""
        temp = self.temp_path(filename)
        try:
            with self.open_new(temp) as stream:
                stream.write(data)
            os.replace(temp, os.path.join(self.path, filename))
        finally:
            with contextlib.suppress(OSError):
                os.remove(temp)

    def remove(self, path: str) -> bool:
        """Delete an entry file; False if it was gone already."""
        try:
            os.remove(path)
        except FileNotFoundError:
            return False
        return True


# -- reading frames --------------------------------------------------------------

# A payload is hashed a piece at a time, each piece right after it lands and
# while it is still in cache: one piece up to 2 MB (measured on 2 cores: one
# read then one hash is fastest there), 2 MB pieces beyond (a 7 MB frame read
# whole, then hashed, outgrows the last-level cache: 20 % slower).
READ_CHUNK = 2 * 1024 * 1024


def read_frame(fd: int, size: int) -> FrameRead:
    """The frame file ``fd`` (``size`` bytes when its size was taken) read whole
    into one array of its own, the payload hashed as it lands.

    The array is sized from the frame's declared length, which must equal
    ``size`` (``codec.check_stored_size``: a padded or cut file raises
    ``CorruptEntryError`` before anything is allocated). A file that shrank
    since comes back short, and decoding rejects what is missing.
    """
    prefix = os.pread(fd, PREFIX_SIZE, 0)
    try:
        header_len, payload_len, *_ = read_prefix(prefix)
    except CorruptEntryError:
        return FrameRead(np.frombuffer(prefix, dtype=np.uint8))  # decoding rejects it
    frame = np.empty(check_stored_size(prefix, size), dtype=np.uint8)
    frame[: len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    done = len(prefix)
    start = PREFIX_SIZE + header_len
    end = start + payload_len
    digest = xxhash.xxh3_64()
    hashed = start
    while True:
        if done > hashed:
            upto = min(done, end)
            digest.update(frame[hashed:upto])
            hashed = upto
        if done >= frame.size:
            break
        piece = READ_CHUNK if done > PREFIX_SIZE else READ_CHUNK - PREFIX_SIZE
        got = os.preadv(fd, [frame[done : done + piece]], done)
        if got <= 0:
            return FrameRead(frame[:done])  # shrank under us
        done += got
    return FrameRead(frame, digest.intdigest() if hashed == end else None)


def read_header_file(path: str) -> dict[str, Any]:
    """The verified frame header of an entry file (payload not read).

    Raises ``CorruptEntryError`` (not a frame, or not a regular file: a FIFO
    or device would block the read, a symlink may lead anywhere) or ``OSError``."""
    with open(open_entry(path)[0], "rb") as stream:
        prefix = stream.read(PREFIX_SIZE)
        header_len, _, _, header_sum = read_prefix(prefix)
        if PREFIX_SIZE + header_len > os.fstat(stream.fileno()).st_size:
            raise CorruptEntryError("truncated header")  # before a read sized by it
        raw = stream.read(header_len)
    if len(raw) < header_len:
        raise CorruptEntryError("truncated header")
    return parse_header(raw, header_sum)


# O_NONBLOCK: opening a FIFO never waits for a writer; O_NOFOLLOW: a symlink
# planted under an entry's name leads nowhere.
ENTRY_OPEN = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_NOT_A_FILE = (errno.ELOOP, errno.ENXIO)  # open(2) of a symlink (O_NOFOLLOW), of a socket


def open_entry(path: str) -> tuple[int, os.stat_result]:
    """A read-only (blocking) descriptor of the regular file ``path`` and its
    stat, never following a symlink nor waiting on a FIFO's writer. Raises
    ``CorruptEntryError`` (no regular file: a FIFO, socket, symlink,
    directory) or ``OSError``."""
    try:
        fd = os.open(path, ENTRY_OPEN)
    except OSError as exc:
        if exc.errno in _NOT_A_FILE:
            raise CorruptEntryError("not a regular file") from None
        raise
    try:
        info = os.fstat(fd)
        if not S_ISREG(info.st_mode):
            raise CorruptEntryError("not a regular file")
        os.set_blocking(fd, True)  # O_NONBLOCK was for open(2) only
    except BaseException:
        os.close(fd)
        raise
    return fd, info
