"""The node tier: one host copy of each entry per node, shared by its processes.

The CPU tier is per process: with 8 tensor-parallel ranks, every rank writes
and stages its own copy of each encoder output. The node tier keeps the same
self-verifying frames as files in shared memory
(``<node_dir>/lmcache-ec-<uid>/node/<namespace slug>``, mode 0700, on
``/dev/shm`` by default), so a frame is held once per node, whichever process
wrote it, and survives the processes (not a reboot).

It is the directory tier of ``frame_directory.py`` (the disk tier's code) on
another directory: the same layout, atomic publication and crash safety (a
process killed mid-write leaves only a pid-tagged temp file, reclaimed by the
next scan), and the same per-directory limit with node-wide LRU
(``budget.py``, ``max_node_size``). Two differences:

- writes are synchronous (a memcpy into tmpfs): a put is readable by every
  process on the node when it returns;
- reads map the file (``MAP_PRIVATE``) instead of copying it: the frame is
  verified in place and the caller gets a tensor over the mapping (a device
  caller copies straight from it). Publication never rewrites a file in place
  and removal only unlinks it, so a mapped frame never changes under a reader;
  a caller writing to its tensor gets private pages.

When the node tier is on, the CPU tier keeps no entries (``manager.py``): its
pool only stages puts and promotions, so each frame is in host memory once.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from ..codec import PREFIX_SIZE, FrameRead
from ..key import ECKey, slug
from .contract import TierKind, tier_setting
from .disk_layout import private_dir
from .frame_directory import FrameDirectoryTier


def node_tier_enabled(config: Any) -> bool:
    return bool(tier_setting(config, "node_tier"))


def node_root(node_dir: str) -> str:
    """Where this user's node-tier directories live (one per namespace)."""
    return os.path.join(node_dir, f"lmcache-ec-{os.getuid()}", "node")


def node_path(node_dir: str, namespace: str) -> str:
    """The node tier's directory for this user and namespace (made, 0700)."""
    private_dir(os.path.dirname(node_root(node_dir)))
    return private_dir(os.path.join(private_dir(node_root(node_dir)), slug(namespace)))


def node_dirs(node_dir: str) -> list[str]:
    """Every namespace directory of this user's node tier (none are made)."""
    root = node_root(node_dir)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n))]


class ECNodeBackend(FrameDirectoryTier):
    kind = TierKind.NODE
    name = "node"
    backend_name = "NodeBackend"

    def __init__(self, config: Any, local_cpu_backend: Any, dst_device: str) -> None:
        super().__init__(
            node_path(tier_setting(config, "node_dir"), tier_setting(config, "namespace")),
            int(float(tier_setting(config, "max_node_size")) * 1024**3),
            float(tier_setting(config, "min_residency_s")),
            local_cpu_backend,
            dst_device,
        )

    def get_frame(self, key: ECKey) -> FrameRead | None:
        """The entry over a private mapping of its file (no copy); its payload
        is hashed when decoded."""
        path = self.path_of(key)
        fd = self._open(key, path)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < PREFIX_SIZE:  # not a frame: decoding rejects it
                return FrameRead(np.frombuffer(os.pread(fd, PREFIX_SIZE, 0), dtype=np.uint8))
            mapped = mmap.mmap(
                fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
            self.layout.touch(fd)
        except OSError as exc:
            self._read_failed(path, exc)
            return None
        finally:
            os.close(fd)
        self._remember(key)
        return FrameRead(np.frombuffer(mapped, dtype=np.uint8))  # keeps the mapping alive
