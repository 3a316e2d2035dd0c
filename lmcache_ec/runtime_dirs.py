"""This user's private directories on this node, found alike by all its processes.

Three features keep state that every process of one user on a node must
find, and that no other user may enter:

- the size ledgers of the disk and node tiers (``tiers/budget.py``):
  ``<user dir>/ledgers``;
- the node tier (``tiers/node.py``): ``<user dir of node_dir>/node/<namespace>``;
- the stage channel's sockets (``integration/vllm/channel.py``):
  ``$XDG_RUNTIME_DIR/lmcache-ec-<uid>``, else the user dir.

The user dir is made under ``node_dir`` (``/dev/shm`` by default; for ledgers
and sockets the temp directory where ``node_dir`` is not writable), a
directory every local user can write. Its name is ``lmcache-ec-<uid>``, made
with mode 0700 and used only while this user owns it: nothing is read or
written in a directory another user owns.

Another local user can make that name first. The user dir is then
``lmcache-ec-<uid>-<token>``: ``token`` is random, made once per user and
kept in ``~/.config/lmcache-ec/runtime-token`` (mode 0600), so every process
of the user finds the same name and nobody else can know it in advance. Once
that directory exists it is preferred, so processes started before and after
the squatter left still agree. Where neither name can be had (no home
directory of this user's, or that name is taken too),
``RuntimeDirUnavailable`` names the path and its owner, and only the feature
that needed it is off (``feature_off``: one warning per path and process).

``$XDG_RUNTIME_DIR`` (made by the login manager for this user alone) serves
the sockets only: a scheduler and its workers share one environment, while
unrelated processes sharing a ledger or the node tier may not (a service has
no login session), and the login manager removes it at the user's last logout.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import hashlib
import logging
import os
import pwd
import secrets
import shutil
import stat
import tempfile
import threading
from dataclasses import dataclass

logger = logging.getLogger(__name__)

NAME = "lmcache-ec"
DEFAULT_BASE = "/dev/shm"  # node_dir's default
TOKEN_FILE = (".config", "lmcache-ec", "runtime-token")  # under the home directory
_TOKEN_HEX = 16  # 64 random bits: nobody makes the name ahead by guessing it
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
    hex_digits = set("0123456789abcdef")
    return text if len(text) == _TOKEN_HEX and set(text) <= hex_digits else None


def _make_token() -> str:
    """This user's token, made if missing (of two processes making it, one wins)."""
    path = token_path()
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        temp = f"{path}.{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_hex(_TOKEN_HEX // 2).encode())
        finally:
            os.close(fd)
        try:
            os.link(temp, path)  # never replaces, never seen half-written
        except FileExistsError:
            pass
        finally:
            os.unlink(temp)
    except OSError as exc:
        raise _unusable(path, exc) from None
    token = _read_token()
    if token is None:
        raise RuntimeDirUnavailable(path, Reason.UNUSABLE, detail="not a private file of this user")
    return token


# -- the directories --------------------------------------------------------------

_log_lock = threading.Lock()
_logged: set[tuple[str, str]] = set()


def _warn_once(key: tuple[str, str], message: str, *args: object) -> None:
    with _log_lock:
        if key in _logged:
            return
        _logged.add(key)
    logger.warning(message, *args)


def user_dir(base: str) -> UserDir:
    """This user's private directory under the shared directory ``base`` (made
    if missing); ``RuntimeDirUnavailable`` names the plain name's owner when
    neither name can be had."""
    plain = os.path.join(base, f"{NAME}-{os.getuid()}")
    token = _read_token()
    if token is not None and _is_private(f"{plain}-{token}"):
        return UserDir(f"{plain}-{token}", _foreign(plain))
    try:
        return UserDir(private_dir(plain))
    except RuntimeDirUnavailable as taken:
        if taken.reason is not Reason.TAKEN:
            raise
        try:
            alternative = private_dir(f"{plain}-{token or _make_token()}")
        except RuntimeDirUnavailable as exc:
            raise RuntimeDirUnavailable(
                plain, Reason.TAKEN, taken.owner, f"no private alternative ({exc})"
            ) from None
        _warn_once(("alternative", plain), "%s; using %s instead", taken, alternative)
        return UserDir(alternative, taken)


def find_user_dir(base: str) -> str | None:
    """The directory ``user_dir(base)`` gives, if it exists; nothing is made."""
    plain = os.path.join(base, f"{NAME}-{os.getuid()}")
    token = _read_token()
    for path in ((f"{plain}-{token}",) if token else ()) + (plain,):
        if _is_private(path):
            return path
    return None


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


def socket_path(engine_id: str, dp_rank: int, tp_rank: int, node_dir: str = DEFAULT_BASE) -> str:
    """The stage channel's socket of one rank of engine ``engine_id`` (a name
    too long for a socket is shortened to a digest of the engine's; binding a
    path still too long fails, and the channel is then off)."""
    directory = socket_dir(node_dir)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in engine_id)[:64]
    path = os.path.join(directory, f"{safe}-dp{dp_rank}-tp{tp_rank}.sock")
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:  # a long base: a digest names the engine
        digest = hashlib.blake2b(engine_id.encode(), digest_size=8).hexdigest()
        path = os.path.join(directory, f"{digest}-dp{dp_rank}-tp{tp_rank}.sock")
    return path


_process_lock = threading.Lock()
_process_dir: str | None = None


def process_dir() -> str:
    """A private directory of this process alone (a random name made with mode
    0700, in the temp directory), removed at exit. Raises ``OSError``."""
    global _process_dir
    with _process_lock:
        if _process_dir is None or not os.path.isdir(_process_dir):
            _process_dir = tempfile.mkdtemp(prefix=f"{NAME}-{os.getuid()}-process-")
            atexit.register(_remove_process_dir, _process_dir, os.getpid())
        return _process_dir


def _remove_process_dir(path: str, pid: int) -> None:
    if os.getpid() == pid:  # not a forked child's: its parent may still use it
        shutil.rmtree(path, ignore_errors=True)


def _forget_process_dir() -> None:
    global _process_dir
    _process_dir = None  # a forked child makes its own


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
