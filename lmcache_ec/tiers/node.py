"""The node tier: one host copy of each entry per node, shared by its processes.

The CPU tier is per process: with 8 tensor-parallel ranks, every rank writes
and stages its own copy of each encoder output. The node tier keeps the same
self-verifying frames as files in shared memory
(``<node_dir>/lmcache-ec-<uid>/node/<namespace slug>``, mode 0700, on
``/dev/shm`` by default; the user directory is ``runtime_dirs.py``'s), so a
frame is held once per node, whichever process wrote it, for as long as a
process on the node uses the tier (``NodeUsers``: the last one to leave
removes the entries, and entries nobody uses are removed by the next process
to start on the directory; a directory deleted under its users and made
again is joined again by each of them, see ``NodeUsers.rejoin``). Where this
user can have no private directory there, the directory cannot be listed, or
its ``.users`` stays locked (a process stopped while it clears it), ``ECNodeBackend``
raises ``RuntimeDirUnavailable`` and the engine runs without the node tier
(``manager.py``).

It is the directory tier of ``frame_directory.py`` (the disk tier's code) on
another directory: the same layout, atomic publication and crash safety (a
process killed mid-write leaves only a pid-tagged temp file, reclaimed by the
next scan), and the same per-directory limit with node-wide LRU
(``budget.py``, ``max_node_size``). The differences:

- writes are synchronous (a memcpy into tmpfs): a put is readable by every
  process on the node when it returns, and a failed write makes ``put``
  return False (``engine.py``);
- the limit is also the file system's free space, less a reserve left to its
  other users (vLLM's shared memory is there too); a write that still finds
  it full (``ENOSPC``) evicts and retries once;
- reads copy the frame into the reader's own memory, then verify it; no
  tensor handed out aliases the shared file, so a file truncated under a
  reader (a ``cp`` over it, ``truncate``, an I/O error) is a miss, never a
  SIGBUS, and an evicted entry's pages are freed at once. A frame's file
  must be exactly as long as its prefix declares (header + payload):
  anything else is a damaged entry, dropped like one, and a read never
  allocates more than the frame it asked for declares.

When the node tier is on, the CPU tier keeps no entries (``manager.py``): its
pool only stages puts and promotions, so each frame is in host memory once.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ..config import from_lmcache
from ..flocks import close_inherited, drop_locks_in_child, flock_within
from ..key import ECKey, slug
from ..runtime_dirs import (
    Reason,
    RuntimeDirUnavailable,
    find_user_dir,
    owner_of,
    private_dir,
    user_dir,
)
from ..tier_contract import TierKind
from .frame_directory import FrameDirectoryTier

logger = logging.getLogger(__name__)


def node_root(node_dir: str) -> str | None:
    """Where this user's node-tier directories live (one per namespace); None
    while this user has no runtime directory under ``node_dir`` (none is made)."""
    user = find_user_dir(node_dir)
    return None if user is None else os.path.join(user, "node")


def node_path(node_dir: str, namespace: str) -> str:
    """The node tier's directory for this user and namespace (made, 0700);
    ``RuntimeDirUnavailable`` where this user can have none."""
    root = private_dir(os.path.join(user_dir(node_dir).path, "node"))
    return private_dir(os.path.join(root, slug(namespace)))


def node_dirs(node_dir: str) -> list[str]:
    """Every namespace directory of this user's node tier (none are made)."""
    root = node_root(node_dir)
    if root is None:
        return []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n))]


USERS_FILE = ".users"  # not an entry name: entries end in .pt, temp files start .tmp-
# ``.users`` is held exclusively only by a user clearing the directory (joining
# alone, or leaving last); one that holds it longer (stopped) costs a joiner
# this wait, then an OSError: the engine starts without the node tier.
USERS_LOCK_WAIT_S = 5.0


class NodeUsers:
    """The processes using one node-tier directory, counted by the kernel: each
    holds a shared ``flock`` on the directory's ``.users`` file while it uses
    it, and a process that ends (however it ends) stops holding it.

    Joining: if nobody else uses the directory (an exclusive lock is free),
    whatever it holds was left by processes that are gone, and ``clear`` runs
    first. Leaving (``leave``: ``close``, or at exit): the last user runs
    ``clear``. A process that joins while a last user clears waits for it, at
    most ``USERS_LOCK_WAIT_S``.

    A directory deleted and made again has a new ``.users`` that nobody
    holds: each user moves its lock there (``rejoin``) when it makes the
    directory again, at its next write if another process did (``current``),
    and before it decides at ``leave`` whether it is the last. Only into a
    directory of this user's: another local user may make the path again
    first (``/dev/shm`` is everyone's), and its ``.users`` is theirs to hold.

    A child forked from a user is none (``flocks.drop_locks_in_child``): it
    closes the descriptor it inherited, so the lock is the parent's alone.
    """

    def __init__(self, directory: str, clear: Callable[[], int]) -> None:
        self._clear = clear
        self._pid = os.getpid()  # a forked child never leaves for us
        self._directory = directory
        self._path = os.path.join(directory, USERS_FILE)
        self._lock = threading.Lock()  # ``rejoin`` swaps the descriptor other threads check
        self._fd = self._open()
        drop_locks_in_child(self)
        try:
            self.cleared_at_start = self._clear() if self._alone() else 0
            flock_within(self._fd, USERS_LOCK_WAIT_S, self._path, shared=True)
        except BaseException:
            os.close(self._fd)
            self._fd = -1  # no number a forked child would close again
            raise
        atexit.register(self.leave)

    def drop_inherited_locks(self) -> None:
        self._fd = close_inherited(self._fd)
        self._lock = threading.Lock()

    def _open(self) -> int:
        """``.users`` (made if missing) of the directory, which must be this
        user's: ``RuntimeDirUnavailable`` (``TAKEN``) before any wait on a lock
        of another user's. Through the directory's descriptor: the check is of
        the directory the file is opened in."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        directory = os.open(self._directory, flags)
        try:
            owner = os.fstat(directory).st_uid
            if owner != os.getuid():
                raise RuntimeDirUnavailable(self._directory, Reason.TAKEN, owner_of(owner))
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(USERS_FILE, flags, 0o600, dir_fd=directory)
        finally:
            os.close(directory)

    def current(self) -> bool:
        """Whether the lock held is on the directory's ``.users`` of now, not on
        one deleted with the directory (True where there is nothing to hold:
        left, or in a forked child)."""
        with self._lock:
            return self._current()

    def _current(self) -> bool:
        if self._fd < 0 or os.getpid() != self._pid:
            return True
        try:
            now = os.stat(self._path)
        except FileNotFoundError:
            return False
        held = os.fstat(self._fd)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def rejoin(self) -> None:
        """Hold the directory's ``.users`` of now, shared, if the lock held is on
        an earlier one; nothing is cleared (what the directory holds is live
        users'). A directory gone again is left for the next write to make.
        Raises ``OSError`` if ``.users`` stays locked past ``USERS_LOCK_WAIT_S``."""
        with self._lock:
            self._rejoin()

    def _rejoin(self) -> None:
        if self._current():
            return
        try:
            fd = self._open()
        except FileNotFoundError:
            return
        try:
            flock_within(fd, USERS_LOCK_WAIT_S, self._path, shared=True)
        except BaseException:
            os.close(fd)
            raise
        old, self._fd = self._fd, fd
        os.close(old)  # drops the lock on the deleted one

    def _alone(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def leave(self) -> int:
        """Stop using the directory; the entries removed (the last user clears it)."""
        if self._fd < 0 or os.getpid() != self._pid:
            return 0
        atexit.unregister(self.leave)
        with self._lock:
            try:
                # Decided on the directory of now (made again since, maybe): its
                # .users, opened afresh, tells whether anyone else still uses it.
                if not self._reopen():
                    return 0  # gone, or no longer this user's: nothing of ours to clear
                return self._clear() if self._alone() else 0
            finally:
                if self._fd >= 0:
                    os.close(self._fd)  # drops the lock
                    self._fd = -1

    def _reopen(self) -> bool:
        """Let our shared lock go and hold a description of our own, unlocked:
        converting the one held to exclusive would hand that lock to a child
        forked past ``drop_locks_in_child`` (by C code) that shares it, for as
        long as the child lives. False if ``.users`` cannot be opened again."""
        os.close(self._fd)
        self._fd = -1
        try:
            self._fd = self._open()
        except OSError:
            return False
        return True


class ECNodeBackend(FrameDirectoryTier):
    kind = TierKind.NODE
    name = "node"
    backend_name = "NodeBackend"
    capped_by_free_space = True  # /dev/shm is shared with vLLM and everyone else
    entries_owned = True  # a private directory: an entry of another user's is forged

    def __init__(self, config: Any, local_cpu_backend: Any, dst_device: str) -> None:
        settings = from_lmcache(config)
        super().__init__(
            node_path(settings.node_dir, settings.namespace),
            settings.node_bytes,
            settings.min_residency_s,
            local_cpu_backend,
            dst_device,
            settings.node_dir,
        )
        try:
            self._users = NodeUsers(self.path, self._clear)
        except RuntimeDirUnavailable:
            raise
        except OSError as exc:  # as a directory that cannot be listed: no node tier
            raise RuntimeDirUnavailable(
                self.path, Reason.UNUSABLE, detail=exc.strerror or str(exc)
            ) from None
        if self._users.cleared_at_start:
            logger.info(
                "node tier %s: removed %d entries left by processes that have ended",
                self.path,
                self._users.cleared_at_start,
            )

    def _clear(self) -> int:
        try:
            return self.budget.clear()
        except OSError as exc:
            logger.warning("node tier %s: clearing failed: %s", self.path, exc)
            return 0

    def _recreate(self) -> None:
        super()._recreate()
        self._users.rejoin()  # a fresh ``.users``: without it, the next joiner clears

    def _reserve(self, name: str, size: int) -> str | None:
        if not self._users.current():  # another process made the directory again
            self.budget.directory_changed()
            # Another user's (``RuntimeDirUnavailable``): the write fails, counted,
            # and nothing is written or waited on there.
            self._users.rejoin()
        return super()._reserve(name, size)

    def holds(self, key: ECKey) -> bool:
        """The entry is stored, or another thread of this process is storing it."""
        return self.exists_in_put_tasks(key) or self.contains(key)

    def close(self) -> None:
        cleared = self._users.leave()
        if cleared:
            logger.info("node tier %s: last user gone, removed %d entries", self.path, cleared)

    def _make_directory(self) -> None:
        # Every level through the ownership check: deleted under us, the user
        # directory may since have been made by another user.
        root = os.path.dirname(self.path)
        private_dir(os.path.dirname(root))
        private_dir(root)
        private_dir(self.path)
