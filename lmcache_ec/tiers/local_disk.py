"""The disk tier: frames as files in ``local_disk``, shared by every process on it.

What LMCache's ``LocalDiskBackend`` lacks, and this tier has (it implements
LMCache's backend interface itself, see ``frame_directory.py``):

- **Restart persistence and sharing.** Upstream keeps shape/dtype only in an
  in-memory index that starts empty. Here entries are self-describing frames
  named by their storage name, and the directory is the index: a restart or
  another process sees every entry.
- **Atomic writes** (temp file, then link/rename): a reader sees a whole frame
  or none; a torn file from elsewhere fails its checksum and is dropped.
- **One size limit for the directory**, whatever the number of processes
  (``budget.py``), with LRU order shared through mtimes.
- **Writes off the caller's path**, on one thread of our own (``writer.py``),
  not LMCache's event loop and worker pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmcache.v1.memory_management import MemoryObj

from ..config import from_lmcache
from ..key import ECKey
from ..tier_contract import TierKind
from .disk_layout import DirectoryModes
from .frame_directory import FrameDirectoryTier
from .writer import BackgroundWriter


class ECLocalDiskBackend(FrameDirectoryTier):
    kind = TierKind.DISK
    name = "disk"
    backend_name = "LocalDiskBackend"

    def __init__(
        self,
        config: Any,
        loop: Any,
        local_cpu_backend: Any,
        dst_device: str,
        lookup_server: Any = None,
        metadata: Any = None,
    ) -> None:
        self._writer = BackgroundWriter("ec-disk-writer")
        settings = from_lmcache(config)
        assert settings.local_disk is not None  # built only with a disk tier
        super().__init__(
            settings.local_disk,
            settings.disk_bytes,
            settings.min_residency_s,
            local_cpu_backend,
            dst_device,
            settings.node_dir,
            DirectoryModes.of(settings.local_disk_group_shared),
        )

    def _dispatch(
        self, key: ECKey, memory_obj: MemoryObj, callback: Callable[[ECKey], None] | None
    ) -> bool:
        return self._writer.submit(self.write_entry, key, memory_obj, callback)

    def close(self) -> None:
        self._writer.close()


__all__ = ["ECLocalDiskBackend"]
