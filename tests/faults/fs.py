"""Real filesystem faults: a full filesystem and a read-only directory.

Both prefer the real thing and fall back, when the kernel refuses it (an
unprivileged CI runner), to the closest real condition; ``method`` says
which one ran and the fault table reports it.

- ``FullDisk``: ``tmpfs`` mounts a small tmpfs on the directory; ``fill()``
  writes a filler file until ``ENOSPC``, ``free()`` deletes it. Fallback
  ``rlimit``: ``fill()`` lowers this process's ``RLIMIT_FSIZE`` so that every
  write past ``RLIMIT_BYTES`` of a file fails (``EFBIG``, Python ignores
  ``SIGXFSZ``) — the same failed ``write(2)`` the tier sees on a full disk;
  ``free()`` restores the limit.
- ``ReadOnlyDir``: a read-only bind mount of the directory onto itself; else
  ``chattr +i`` (no entry can be created, renamed or removed in it); else
  ``chmod 0555`` (enough when not running as root). Each is verified by
  trying to create a file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

RLIMIT_BYTES = 1 << 20  # frames in the disk-full cases are larger than this


def _run(*args: str) -> bool:
    binary = shutil.which(args[0])
    if binary is None:
        return False
    done = subprocess.run([binary, *args[1:]], capture_output=True, check=False)
    return done.returncode == 0


class FullDisk:
    def __init__(self, path: Path, prefer: str = "tmpfs", size_mb: int = 8) -> None:
        self.path = path
        self.method = "rlimit"
        self._limit: tuple[int, int] | None = None
        if prefer == "tmpfs" and _run(
            "mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)
        ):
            self.method = "tmpfs"

    def fill(self) -> None:
        if self.method == "rlimit":
            self._limit = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (RLIMIT_BYTES, self._limit[1]))
            return
        with open(self.path / "filler", "wb", buffering=0) as stream:
            for chunk in (1 << 20, 4096, 1):
                try:
                    while stream.write(b"\0" * chunk):
                        pass
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
        assert shutil.disk_usage(self.path).free < 64 * 1024

    def free(self) -> None:
        if self.method == "rlimit":
            if self._limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, self._limit)
                self._limit = None
            return
        with contextlib.suppress(FileNotFoundError):
            (self.path / "filler").unlink()

    def close(self) -> None:
        self.free()
        if self.method == "tmpfs":
            _run("umount", "-l", str(self.path))


class ReadOnlyDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.method: str | None = None

    def _writable(self) -> bool:
        probe = self.path / ".write-probe"
        try:
            probe.write_bytes(b"x")
        except OSError:
            return False
        probe.unlink()
        return True

    def protect(self) -> None:
        attempts = (
            ("ro-bind-mount", self._bind_ro, lambda: _run("umount", "-l", str(self.path))),
            (
                "chattr+i",
                lambda: _run("chattr", "+i", str(self.path)),
                lambda: _run("chattr", "-i", str(self.path)),
            ),
            (
                "chmod-0555",
                lambda: os.chmod(self.path, 0o555) or True,
                lambda: os.chmod(self.path, 0o755),
            ),
        )
        for method, apply, undo in attempts:
            if apply() and not self._writable():
                self.method, self._undo = method, undo
                return
            undo()
        raise AssertionError(f"could not make {self.path} read-only by any method")

    def _bind_ro(self) -> bool:
        if not _run("mount", "--bind", str(self.path), str(self.path)):
            return False
        return _run("mount", "-o", "remount,ro,bind", str(self.path))

    def release(self) -> None:
        if self.method is not None:
            self._undo()
            self.method = None


@contextlib.contextmanager
def tiny_tmpfs(size_mb: int) -> Iterator[str]:
    """A new directory with a tmpfs of ``size_mb`` MiB mounted on it (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    point = tempfile.mkdtemp(prefix="ec-tiny-shm-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", point], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", point], check=True)
        os.rmdir(point)


def node_tier_on(directory: str) -> dict:
    """A CPU + node tier whose node directory is ``directory``, its free space the limit."""
    return {
        "local_cpu": True,
        "max_local_cpu_size": 0.05,
        "local_disk": None,
        "node_tier": True,
        "node_dir": directory,
        "max_node_size": 4,  # far beyond the filesystem: its free space is the limit
        "min_residency_s": 0,
        "namespace": "tiny-shm",
    }
