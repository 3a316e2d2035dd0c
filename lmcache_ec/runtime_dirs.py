"""This user's private directories on this node, found alike by all its processes.

Three features keep state that every process of one user on a node must
find, and that no other user may enter:

- the size ledgers of the disk and node tiers (``tiers/budget.py``):
  ``<user dir>/ledgers`` (a group-shared disk directory's is in it);
- the node tier (``tiers/node.py``): ``<user dir of node_dir>/node/<namespace>``;
- the stage channel's sockets (``integration/vllm/channel.py``):
  ``$XDG_RUNTIME_DIR/lmcache-ec-<uid>``, else the user dir.

The user dir is made under ``node_dir`` (``/dev/shm`` by default; for ledgers
and sockets the temp directory where ``node_dir`` is not writable), a
directory every local user can write. Its name is ``lmcache-ec-<uid>``, made
with mode 0700 and used only while this user owns it: nothing is read or
written in a directory another user owns.

Another local user can make that name first. The user dir is then
``lmcache-ec-<uid>-<token>``: ``token`` is random and kept in
``~/.config/lmcache-ec/runtime-token`` (mode 0600), so every process of the
user finds the same name and nobody else can know it before it is made. Once
that directory exists it is preferred, so processes started before and after
the squatter left still agree. Its name can be seen in the shared base, and a
reboot empties a tmpfs, so another user may take that name too: a fresh token
then replaces the old one (written aside and renamed over it, under a lock,
so this user's processes replacing it at once agree on one) and later
processes find the new name. A private directory of this user's under an
earlier token's name is still preferred where it is there: nodes may share
a home, and a token replaced on one leaves the others' processes where they
are. Where no name can be had (no home directory of
this user's, a base that cannot be written), ``RuntimeDirUnavailable`` names
the path and its owner, and only the feature that needed it is off
(``feature_off``: one warning per path and process).

``$XDG_RUNTIME_DIR`` (made by the login manager for this user alone) serves
the sockets only: a scheduler and its workers share one environment, while
unrelated processes sharing a ledger or the node tier may not (a service has
no login session), and the login manager removes it at the user's last logout.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import fcntl
import hashlib
import logging
import os
import pwd
import secrets
import shutil
import stat
import string
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from .flocks import close_inherited, flock_within

logger = logging.getLogger(__name__)

NAME = "lmcache-ec"
DEFAULT_BASE = "/dev/shm"  # node_dir's default
TOKEN_FILE = (".config", "lmcache-ec", "runtime-token")  # under the home directory
_TOKEN_HEX = 16  # 64 random bits: nobody makes the name ahead by guessing it
_TOKEN_TRIES = 3  # fresh tokens tried when each one's name is found taken
_TOKEN_LOCK_S = 2.0  # a holder stuck longer (stopped) is not waited for
SOCKET_PATH_MAX = 107  # a Unix socket's path: 108 bytes, its NUL included


class Feature(enum.Enum):
    """What needs a private runtime directory, and is off without one."""

    NODE_TIER = "node_tier"
    SHARED_LEDGER = "shared_ledger"
    STAGE_CHANNEL = "stage_channel"


class Reason(enum.Enum):
    TAKEN = "directory_taken"  # there, but not a directory this user owns
    UNUSABLE = "directory_unusable"  # cannot be made (no such base, read-only, full)


class RuntimeDirUnavailable(PermissionError):
    """No private directory at ``path``: ``owner`` holds it (``TAKEN``), or it
    cannot be made (``UNUSABLE``, ``detail`` says why)."""

    def __init__(self, path: str, reason: Reason, owner: str | None = None, detail: str = ""):
        self.path = path
        self.reason = reason
        self.owner = owner
        self.detail = detail
        text = f"{path} belongs to {owner}, not this user" if owner else f"{path}: {detail}"
        if owner and detail:
            text += f"; {detail}"
        super().__init__(text)


@dataclass(frozen=True)
class UserDir:
    path: str
    taken: RuntimeDirUnavailable | None = None  # the plain name, held by another user


def owner_of(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _foreign(path: str) -> RuntimeDirUnavailable | None:
    """Why ``path`` is not a directory of this user's (None: it is, or it is not there)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a parent this user may not search
        return _unusable(path, exc)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
        return None
    return RuntimeDirUnavailable(path, Reason.TAKEN, owner_of(info.st_uid))


def _unusable(path: str, exc: OSError) -> RuntimeDirUnavailable:
    return RuntimeDirUnavailable(path, Reason.UNUSABLE, detail=exc.strerror or str(exc))


def private_dir(path: str) -> str:
    """``path``, made if missing, mode 0700; ``RuntimeDirUnavailable`` unless it
    is a directory of this user's (another user may have made it first in a
    world-writable parent such as /dev/shm). Its parent must exist."""
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        taken = _foreign(path)
        if taken is not None:
            raise taken
        if os.lstat(path).st_mode & 0o077:
            os.chmod(path, 0o700)  # ours: only we decide who may enter
    except RuntimeDirUnavailable:
        raise
    except OSError as exc:
        raise _unusable(path, exc) from None
    return path


def _is_private(path: str) -> bool:
    """A directory of this user's that nobody else may enter (not made or changed here)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


# -- the token of the unpredictable name -----------------------------------------


def token_path() -> str:
    return os.path.join(os.path.expanduser("~"), *TOKEN_FILE)


def _read_token() -> str | None:
    """This user's token; None if none was made, or the file is not this user's alone."""
    try:
        fd = os.open(token_path(), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        text = os.read(fd, 64).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return text if _is_token(text) else None


def _is_token(text: str) -> bool:
    return len(text) == _TOKEN_HEX and set(text) <= set("0123456789abcdef")


def _write_token(path: str) -> str:
    """A fresh token, written aside and renamed over ``path``: a reader finds
    the old token or the new one, never part of one."""
    token = secrets.token_hex(_TOKEN_HEX // 2)
    temp = f"{path}.{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.write(fd, token.encode())
        finally:
            os.close(fd)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return token


@contextlib.contextmanager
def _token_lock(path: str) -> Iterator[None]:
    """Held while the token at ``path`` is read and replaced, so that this
    user's processes replacing it at once agree on one. Without it (a file
    system with no locks, a holder stopped for ``_TOKEN_LOCK_S``) racing
    processes may each use a private directory of their own: still never one
    another user holds."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with contextlib.suppress(OSError):  # held too long, or no locks on this file system
            flock_within(fd, _TOKEN_LOCK_S, path)
        yield
    finally:
        os.close(fd)  # releases the lock


def _alternative(plain: str) -> tuple[str, list[RuntimeDirUnavailable]]:
    """``<plain>-<token>``, a private directory of this user's, and the names
    found taken on the way: a token whose name another user holds (it is
    listed in the shared base) is replaced by a fresh one, which this user's
    later processes read. ``RuntimeDirUnavailable`` if none can be had."""
    path = token_path()
    taken: list[RuntimeDirUnavailable] = []
    try:
        with _token_lock(path):
            token = _read_token()  # again: another process may have replaced it
            for _ in range(_TOKEN_TRIES):
                if token is None:
                    token = _write_token(path)
                try:
                    return private_dir(f"{plain}-{token}"), taken
                except RuntimeDirUnavailable as exc:
                    if exc.reason is not Reason.TAKEN:
                        raise
                    taken.append(exc)
                    token = None
    except RuntimeDirUnavailable:
        raise
    except OSError as exc:
        raise _unusable(path, exc) from None
    raise taken[-1]


# -- the directories --------------------------------------------------------------

_log_lock = threading.Lock()
_logged: set[tuple[str, str]] = set()


def _warn_once(key: tuple[str, str], message: str, *args: object) -> None:
    with _log_lock:
        if key in _logged:
            return
        _logged.add(key)
    logger.warning(message, *args)


def _existing_alternative(plain: str) -> str | None:
    """A private directory of this user's under an alternative name, if one is
    there: the token's, else the first by name that an earlier token named (a
    process on another node sharing this home may have replaced the token;
    this node's processes keep the directory they were using)."""
    token = _read_token()
    if token is not None and _is_private(f"{plain}-{token}"):
        return f"{plain}-{token}"
    base, prefix = os.path.split(plain)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return None
    for name in names:
        earlier = name.startswith(f"{prefix}-") and _is_token(name[len(prefix) + 1 :])
        # Private and this user's: no other user made it, whoever knew the name.
        if earlier and _is_private(os.path.join(base, name)):
            return os.path.join(base, name)
    return None


def user_dir(base: str) -> UserDir:
    """This user's private directory under the shared directory ``base`` (made
    if missing); ``RuntimeDirUnavailable`` names the plain name's owner when
    no name can be had."""
    plain = os.path.join(base, f"{NAME}-{os.getuid()}")
    found = _existing_alternative(plain)
    if found is not None:
        return UserDir(found, _foreign(plain))
    try:
        return UserDir(private_dir(plain))
    except RuntimeDirUnavailable as taken:
        if taken.reason is not Reason.TAKEN:
            raise
        try:
            alternative, also_taken = _alternative(plain)
        except RuntimeDirUnavailable as exc:
            raise RuntimeDirUnavailable(
                plain, Reason.TAKEN, taken.owner, f"no private alternative ({exc})"
            ) from None
        replaced = "".join(f"; {each}: a new token was made" for each in also_taken)
        # Once per directory: a token replaced later in this process is news.
        _warn_once(
            ("alternative", alternative), "%s%s; using %s instead", taken, replaced, alternative
        )
        return UserDir(alternative, taken)


def find_user_dir(base: str) -> str | None:
    """The directory ``user_dir(base)`` gives, if it exists; nothing is made."""
    plain = os.path.join(base, f"{NAME}-{os.getuid()}")
    found = _existing_alternative(plain)
    return found if found is not None or not _is_private(plain) else plain


def state_base(node_dir: str = DEFAULT_BASE) -> str:
    """The shared directory under which ledgers (and sockets) live: ``node_dir``
    if this user can write it, else the temp directory."""
    if os.path.isdir(node_dir) and os.access(node_dir, os.W_OK | os.X_OK):
        return node_dir
    return tempfile.gettempdir()


def socket_dir(node_dir: str = DEFAULT_BASE) -> str:
    """The stage channel's directory: in ``$XDG_RUNTIME_DIR`` when it is this
    user's private directory, else the user dir of ``state_base(node_dir)``."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and _is_private(xdg):
        return private_dir(os.path.join(xdg, f"{NAME}-{os.getuid()}"))
    return user_dir(state_base(node_dir)).path


def socket_path(
    engine_id: str,
    dp_rank: int,
    tp_rank: int,
    node_dir: str = DEFAULT_BASE,
    *,
    instance: str = "",
) -> str:
    """The stage channel's socket of one rank of engine ``engine_id`` launched as
    ``instance`` (vLLM's ``instance_id``: the same in the engine core and its
    workers, new at each launch), ``<engine id, cut>-<digest>-dp<d>-tp<r>.sock``.

    The digest of both keeps apart what the readable part alone would not: two
    engines launched with one engine id, ids that differ only in characters a
    file name cannot hold or past the cut. A base too long for a socket drops
    the readable part; binding a path still too long fails (the channel is off).
    """
    directory = socket_dir(node_dir)
    digest = hashlib.blake2b(repr((engine_id, instance)).encode(), digest_size=8).hexdigest()
    readable = "".join(c if c in _SOCKET_NAME_CHARS else "_" for c in engine_id[:24])
    suffix = f"{digest}-dp{dp_rank}-tp{tp_rank}.sock"
    path = os.path.join(directory, f"{readable}-{suffix}" if readable else suffix)
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        path = os.path.join(directory, suffix)
    return path


_SOCKET_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "-_")


_process_lock = threading.Lock()
_process_dir: str | None = None
_alive_fd = -1  # holds the flock on this process's ``ALIVE`` file
ALIVE = ".alive"  # in a process directory: flocked by its process for as long as it lives


def process_dir() -> str:
    """A private directory of this process alone,
    ``<temp dir>/lmcache-ec-<uid>-process-<pid>-<random>`` (mode 0700), removed
    at exit. A process killed (SIGKILL, the OOM killer) cannot remove its own:
    the next one of this user that makes one does. Raises ``OSError``."""
    global _process_dir, _alive_fd
    with _process_lock:
        if _process_dir is None or not os.path.isdir(_process_dir):
            _sweep_process_dirs()
            path = tempfile.mkdtemp(prefix=f"{_process_prefix()}{os.getpid()}-")
            if _alive_fd >= 0:
                os.close(_alive_fd)  # the lock of a directory gone
            _alive_fd = _hold_alive(path)
            _process_dir = path
            atexit.register(_remove_process_dir, path, os.getpid())
        return _process_dir


def numba_cache_where_needed() -> None:
    """Point numba's cache at this process's directory where it has none.

    LMCache compiles numba kernels with ``cache=True`` when imported; with no
    writable place for that cache (a read-only ``site-packages`` and a home
    that cannot be written: an arbitrary container uid) its import fails, and
    LMCache blames a missing torch. Where ``NUMBA_CACHE_DIR`` is unset and
    numba's own user cache directory cannot be made, ``NUMBA_CACHE_DIR`` is
    set to ``<process dir>/numba`` (compiled again in each process)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    user_cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    if _can_make(os.path.join(user_cache, "numba")):
        return
    with contextlib.suppress(OSError):
        os.environ["NUMBA_CACHE_DIR"] = os.path.join(process_dir(), "numba")


def _can_make(path: str) -> bool:
    """Whether ``path`` is, or could be made as, a directory this process may write."""
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def _process_prefix() -> str:
    return f"{NAME}-{os.getuid()}-process-"


def _hold_alive(path: str) -> int:
    """A descriptor holding a flock on ``path``'s ``ALIVE`` file while this
    process lives: the kernel drops it however the process dies, and in any pid
    namespace (a pid says nothing about a process in another container sharing
    the temp directory). Locked before it gets its name, so no sweep finds it
    unlocked. -1 where it cannot be had: the directory is then never swept."""
    temp = os.path.join(path, f"{ALIVE}-new")
    flags = os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(temp, flags, 0o600)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else knows the file yet
        os.rename(temp, os.path.join(path, ALIVE))
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp)
        return -1
    return fd


def _sweep_process_dirs() -> None:
    """Remove the process directories that this user's dead processes left in
    the temp directory (one listing of it). Never raises: what cannot be
    looked at or removed is left."""
    base = tempfile.gettempdir()
    prefix = _process_prefix()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            with contextlib.suppress(OSError):
                _remove_if_dead(os.path.join(base, name))


def _remove_if_dead(path: str) -> None:
    """Remove process directory ``path`` if it is this user's and no process
    holds its ``ALIVE`` lock. Never follows a symlink; one without ``ALIVE``
    (made by an older version, or not yet set up) is left."""
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(dir_fd).st_uid != os.getuid():
            return  # another user's: never touched
        alive = os.open(
            ALIVE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
        try:
            fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: it lives
            for name in os.listdir(dir_fd):
                if name != ALIVE:  # last: a directory that cannot be emptied is tried again
                    os.unlink(name, dir_fd=dir_fd)  # ledgers are files; a subdirectory stays
            os.unlink(ALIVE, dir_fd=dir_fd)
        finally:
            os.close(alive)
    finally:
        os.close(dir_fd)
    os.rmdir(path)


def _remove_process_dir(path: str, pid: int) -> None:
    if os.getpid() == pid:  # not a forked child's: its parent may still use it
        shutil.rmtree(path, ignore_errors=True)


def _forget_process_dir() -> None:
    global _process_dir, _alive_fd
    _process_dir = None  # a forked child makes its own
    _alive_fd = close_inherited(_alive_fd)  # the parent's lock ends with the parent


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_process_dir)


def feature_off(feature: Feature, error: RuntimeDirUnavailable, consequence: str) -> None:
    """Log, once per process, feature and path, that ``feature`` is off and why."""
    _warn_once(
        (feature.value, error.path),
        "%s off: %s. %s",
        feature.value,
        error,
        consequence,
    )


__all__ = [
    "DEFAULT_BASE",
    "Feature",
    "Reason",
    "RuntimeDirUnavailable",
    "UserDir",
    "feature_off",
    "find_user_dir",
    "private_dir",
    "process_dir",
    "socket_dir",
    "socket_path",
    "state_base",
    "user_dir",
]
