"""The size ledger of a group-shared disk directory (``local_disk_group_shared``).

Its users' runtime directories are each their own, so the ledger lives in the
directory itself (``GROUP_LEDGER``, mode 0660), where every user of the group
finds it; ``budget.py`` keeps it. It is used only while it is a regular file
of this user's or of the directory's group, in a directory others cannot
write: anyone else could make every member over- or under-count.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mode

from ..runtime_dirs import Reason, RuntimeDirUnavailable, owner_of

GROUP_LEDGER = ".ledger"  # a group-shared directory's ledger, in it (never an entry's name)
# O_NOFOLLOW: a symlink planted there leads nowhere; O_NONBLOCK: nor does a FIFO wait.
_GROUP_LEDGER_OPEN = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _untrusted(info: os.stat_result, directory: os.stat_result) -> str | None:
    """Why the file ``info`` is no ledger of the group-shared ``directory``'s
    (None: it is). Only members (or the directory's owner) can make a file of
    the directory's group in it, unless others may write into it too."""
    if not stat_mode.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid == os.getuid():
        return None
    if info.st_gid != directory.st_gid or (info.st_mode | directory.st_mode) & 0o002:
        return "not a file of the directory's group that only the group may write"
    return None


def open_group_ledger(path: str, directory: os.stat_result) -> int:
    """The ledger ``path`` of the group-shared ``directory`` (made 0660 if
    missing), open for reading and writing. Raises ``RuntimeDirUnavailable``
    for a file that is no ledger of the group's (a symlink, a FIFO, an
    outsider's file), ``OSError``."""
    try:
        fd = os.open(path, _GROUP_LEDGER_OPEN, 0o660)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise RuntimeDirUnavailable(path, Reason.TAKEN, detail="a symbolic link") from None
    try:
        info = os.fstat(fd)
        why = _untrusted(info, directory)
        if why is not None:
            raise RuntimeDirUnavailable(path, Reason.TAKEN, owner_of(info.st_uid), why)
        if info.st_uid == os.getuid() and stat_mode.S_IMODE(info.st_mode) != 0o660:
            os.fchmod(fd, 0o660)  # made now: the umask may have taken the group's bits
    except BaseException:
        os.close(fd)
        raise
    return fd
