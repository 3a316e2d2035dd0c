"""The StorageManager of the encoder tier.

LMCache's ``CreateStorageBackends`` fixes the hierarchy
(LocalCPU → LocalDisk → remote → plugins). This subclass builds the first two
from lmcache-ec's subclasses and leaves everything after them — remote URLs,
remote storage plugins, storage plugins — to upstream, in upstream's order.
"""

from __future__ import annotations

from lmcache import torch_device_type
from lmcache.v1.storage_backend import is_cuda_worker
from lmcache.v1.storage_backend.storage_manager import StorageManager

from .local_cpu import ECLocalCPUBackend
from .local_disk import ECLocalDiskBackend

CPU_BACKEND = "LocalCPUBackend"
DISK_BACKEND = "LocalDiskBackend"
TIER_NAMES = {CPU_BACKEND: "cpu", DISK_BACKEND: "disk", "RemoteBackend": "remote"}


def tier_name(backend_name: str) -> str:
    """The short tier name users see (``cpu``, ``disk``, ``remote``, plugin names)."""
    if backend_name in TIER_NAMES:
        return TIER_NAMES[backend_name]
    return backend_name.removeprefix("RemoteBackend-")


class ECStorageManager(StorageManager):
    def create_backends(self) -> dict[str, str]:
        created: dict[str, str] = {}
        dst_device = torch_device_type if is_cuda_worker(self.metadata) else "cpu"
        with self.manager_lock:
            cpu = self.storage_backends.get(CPU_BACKEND)
            if cpu is None:
                cpu = ECLocalCPUBackend(self.config, self.metadata, dst_device)
                self.storage_backends[CPU_BACKEND] = cpu
                created[CPU_BACKEND] = type(cpu).__name__
            if self.config.local_disk and DISK_BACKEND not in self.storage_backends:
                disk = ECLocalDiskBackend(
                    self.config, self.loop, cpu, dst_device, None, self.metadata
                )
                self.storage_backends[DISK_BACKEND] = disk
                created[DISK_BACKEND] = type(disk).__name__
        created.update(super().create_backends())
        return created
