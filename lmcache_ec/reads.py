"""The read path of ``ECCache``: walk the tiers for one key, verify, promote.

Called by ``ECCache.get``/``get_many`` once per key, in the caller's thread.
Tiers are asked in LMCache's order (CPU → disk → remote); the first hit wins.

- A CPU hit reuses the layout verified when its buffer entered the tier (a
  ``codec.Payload`` kept on the memory object): a frame in the pool never left
  this process and is never written after it entered the tier, so neither
  checksum is recomputed.
- A hit below the CPU tier is read into fresh memory, verified (both
  checksums, key, dtype, shape), and its payload becomes the caller's tensor
  without another copy. It is then promoted into the tiers above it: a remote
  hit at once (one copy into the CPU pool), a disk hit by the ``Promoter``
  thread (``promotion.py``), which re-reads and re-verifies it once reads
  pause; a later read, ``contains`` or ``remove`` of that key first finishes
  (or drops) the pending promotion.
- A frame that fails verification is removed from every tier and counted; the
  read is a miss. A tier that raises is counted and skipped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple, NoReturn

import numpy as np
import torch
from lmcache.v1.memory_management import MemoryFormat, MemoryObj

from . import codec
from .key import ECKey
from .metrics import ECStats
from .promotion import Promoter
from .tiers import tier_name

logger = logging.getLogger(__name__)

_PAYLOAD = "_ec_payload"  # attribute holding a buffer's verified layout
CPU_BACKEND = "LocalCPUBackend"
LOCAL_BACKENDS = (CPU_BACKEND, "LocalDiskBackend")


class Hit(NamedTuple):
    tier: str
    memory_obj: MemoryObj | None  # a held CPU-pool buffer the caller releases, if any
    payload: codec.Payload


class Prefetched(NamedTuple):
    backend: Any  # the tier the frames came from
    frames: dict[ECKey, bytes | None]  # None: that tier does not have the key


class _Dropped(Exception):
    """A corrupt entry was found and removed: the read is a miss."""


def frame_bytes(memory_obj: MemoryObj) -> torch.Tensor | None:
    """The bytes of a frame buffer, possibly followed by allocator padding.

    ``MemoryObj.tensor`` builds three views per call; frames carry their own
    lengths, so the pool slice itself is enough.
    """
    raw = getattr(memory_obj, "raw_data", None)
    if isinstance(raw, torch.Tensor) and raw.dtype == torch.uint8 and raw.dim() == 1:
        return raw if getattr(memory_obj, "valid", True) else None
    return memory_obj.tensor


def remember_payload(memory_obj: MemoryObj, payload: codec.Payload) -> None:
    """Keep ``payload`` (verified, aliasing ``memory_obj``) for later CPU hits.

    Safe because LMCache builds a new memory object for every allocation: the
    layout lives and dies with the buffer it describes.
    """
    # Memory objects with __slots__ (none of LMCache's CPU ones) decode on each hit.
    with contextlib.suppress(AttributeError):
        setattr(memory_obj, _PAYLOAD, payload)


class TierReader:
    def __init__(self, storage: Any, cpu: Any, stats: ECStats) -> None:
        self._storage = storage
        self._cpu = cpu
        self._stats = stats
        self._promoter = Promoter(self._promote_from)

    def settle(self, key: ECKey) -> None:
        """Finish a pending background promotion of ``key``, if any."""
        self._promoter.settle(key)

    def cancel(self, key: ECKey) -> None:
        """Drop a pending background promotion of ``key``, if any."""
        self._promoter.cancel(key)

    def pending(self) -> int:
        """Background promotions queued or running."""
        return self._promoter.pending()

    def close(self, timeout: float) -> None:
        self._promoter.close(timeout)

    def read(self, key: ECKey, prefetched: Prefetched | None = None) -> Hit | None:
        """The first verified hit for ``key``, or None (miss, or corrupt and dropped).

        ``prefetched``: frames already fetched for a batch (``prefetch``).
        """
        self._promoter.reading()
        self._promoter.settle(key)  # a read after a disk hit is a CPU hit
        try:
            if self._cpu.use_hot:
                try:
                    memory_obj = self._cpu.get_blocking(key)
                except Exception as exc:
                    self.tier_failed(CPU_BACKEND, "get", exc)
                    memory_obj = None
                if memory_obj is not None:
                    payload = getattr(memory_obj, _PAYLOAD, None)
                    if payload is not None and payload.name == key.storage_name:
                        return Hit("cpu", memory_obj, payload)
                    return self._from_buffer(key, 0, CPU_BACKEND, memory_obj)
            for level, (name, backend) in enumerate(self._storage.get_active_storage_backends()):
                if backend is not self._cpu:
                    hit = self._from_backend(key, level, name, backend, prefetched)
                    if hit is not None:
                        return hit
        except _Dropped:
            pass
        return None

    def prefetch(self, keys: Sequence[ECKey]) -> Prefetched | None:
        """Frames of the ``keys`` no local tier holds, from the first remote tier
        in one request (Redis: ``MGET``); None when there is nothing to batch.

        Only existence is checked locally, so a batch larger than the CPU pool
        holds no pool memory here; ``read`` then walks each key as usual and
        takes its frame from the batch when it reaches that tier.
        """
        local = []
        for name, backend in self._storage.get_active_storage_backends():
            if name not in LOCAL_BACKENDS:
                break
            if backend is not self._cpu or self._cpu.use_hot:
                local.append(backend)
        else:
            return None  # no remote tier
        if not getattr(backend, "reads_frame_batches", False):
            return None
        wanted = [key for key in dict.fromkeys(keys) if not self._held_locally(key, local)]
        if len(wanted) < 2:
            return None
        try:
            frames = backend.get_frames(wanted)
        except Exception as exc:
            self.tier_failed(name, "get", exc)
            return None
        return Prefetched(backend, dict(zip(wanted, frames, strict=True)))

    @staticmethod
    def _held_locally(key: ECKey, local: list[Any]) -> bool:
        for backend in local:
            try:
                if backend.contains(key):
                    return True
            except Exception:
                pass  # the read itself reports a failing tier
        return False

    def _from_backend(
        self, key: ECKey, level: int, name: str, backend: Any, prefetched: Prefetched | None
    ) -> Hit | None:
        data = memory_obj = None
        try:
            if (
                prefetched is not None
                and prefetched.backend is backend
                and key in prefetched.frames
            ):
                data = prefetched.frames.pop(key)
            elif getattr(backend, "reads_frames", False):
                data = backend.get_frame(key)
            else:
                memory_obj = backend.get_blocking(key)
        except Exception as exc:
            self.tier_failed(name, "get", exc)
            return None
        if data is not None:
            from_bytes = isinstance(data, bytes)
            try:
                payload = (
                    codec.decode_bytes(data, key) if from_bytes else codec.decode_parts(data, key)
                )
            except Exception as exc:
                self._drop(key, name, exc)
            if from_bytes:
                self._promote_bytes(key, data, payload, level)
            elif self._cpu.use_hot or level > 1:  # some tier above wants it
                self._promoter.submit(key, level, self._cpu.stamp())
            return Hit(tier_name(name), None, payload)
        if memory_obj is None:
            return None
        return self._from_buffer(key, level, name, memory_obj)

    def _from_buffer(self, key: ECKey, level: int, name: str, memory_obj: MemoryObj) -> Hit | None:
        payload = getattr(memory_obj, _PAYLOAD, None)
        if payload is None or payload.name != key.storage_name:
            buffer = frame_bytes(memory_obj)
            if buffer is None:
                memory_obj.ref_count_down()
                return None
            try:
                payload = codec.decode_payload(buffer, key, verify_payload=level > 0)
            except Exception as exc:
                memory_obj.ref_count_down()
                self._drop(key, name, exc)
            remember_payload(memory_obj, payload)
        if level > 0:
            self._submit(key, memory_obj, self._tiers_above(level))
        return Hit(tier_name(name), memory_obj, payload)

    def _drop(self, key: ECKey, name: str, exc: Exception) -> NoReturn:
        # Stored bytes are untrusted (shared disks and stores): whatever they
        # make the decoder raise, the answer is a miss, never an error.
        reason = exc.reason if isinstance(exc, codec.CorruptEntryError) else repr(exc)
        self._stats.add("integrity_failures")
        logger.warning("Dropping corrupt entry %s from %s: %s", key, name, reason)
        self.remove_everywhere(key)
        raise _Dropped from None

    # -- promotion -----------------------------------------------------------

    def _tiers_above(self, level: int) -> list[tuple[str, Any]]:
        tiers = []
        for upper, (name, backend) in enumerate(self._storage.get_active_storage_backends()):
            if upper >= level:
                break
            if backend is not self._cpu or self._cpu.use_hot:
                tiers.append((name, backend))
        return tiers

    def _submit(self, key: ECKey, memory_obj: MemoryObj, tiers: list[tuple[str, Any]]) -> None:
        for name, backend in tiers:
            try:
                backend.batched_submit_put_task([key], [memory_obj])
            except Exception as exc:
                self.tier_failed(name, "promote", exc)

    def _promote_from(self, key: ECKey, level: int, since: int) -> None:
        """On the promoter thread: read ``key`` again from tier ``level`` into the
        CPU pool, verify it and hand it to the tiers above. ``since``: the CPU
        tier's use tick when the caller read it; the pool buffer may evict only
        entries not used after that (``ECLocalCPUBackend.allocate_after``)."""
        tiers = self._tiers_above(level)
        source = None
        for upper, (_, backend) in enumerate(self._storage.get_active_storage_backends()):
            if upper == level:
                source = backend
                break
        if not tiers or not hasattr(source, "read_into_pool"):
            return
        if self._cpu.use_hot and self._cpu.contains(key):
            return
        memory_obj = source.read_into_pool(key, lambda size: self._cpu.allocate_after(size, since))
        if memory_obj is None:
            return
        try:
            buffer = frame_bytes(memory_obj)
            if buffer is not None:
                # Verified again: the entry may have changed since the caller's read.
                payload = codec.decode_payload(buffer, key)
                remember_payload(memory_obj, payload)
                self._submit(key, memory_obj, tiers)
        except codec.CorruptEntryError:
            pass  # the next read of the entry finds it and drops it
        finally:
            memory_obj.ref_count_down()

    def _promote_bytes(self, key: ECKey, data: Any, payload: codec.Payload, level: int) -> None:
        """One copy of a verified frame into the CPU pool, for the tiers above ``level``."""
        tiers = self._tiers_above(level)
        if not tiers:
            return
        size = len(data)
        memory_obj = self._cpu.allocate(
            torch.Size([size]), torch.uint8, MemoryFormat.EC_TD, busy_loop=False
        )
        buffer = None if memory_obj is None else frame_bytes(memory_obj)
        if buffer is None:
            if memory_obj is not None:
                memory_obj.ref_count_down()
            return  # pool full right now: served, not promoted
        try:
            np.copyto(buffer.numpy()[:size], np.frombuffer(data, dtype=np.uint8))
            remember_payload(memory_obj, payload.over(buffer))
            self._submit(key, memory_obj, tiers)
        finally:
            memory_obj.ref_count_down()

    # -- shared with the rest of the engine -----------------------------------

    def remove_everywhere(self, key: ECKey) -> None:
        # Not StorageManager.remove: one tier failing (a read-only disk) must
        # neither stop the others nor reach the caller.
        for name, backend in self._storage.storage_backends.items():
            try:
                backend.remove(key)
            except Exception as exc:
                self.tier_failed(name, "remove", exc)

    def tier_failed(self, name: str, operation: str, exc: Exception) -> None:
        self._stats.tier_error(tier_name(name))
        logger.warning("%s tier failed on %s: %s", tier_name(name), operation, exc)
