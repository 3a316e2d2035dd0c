"""Reads into caller tensors: a hit's payload copied to the host or a device.

``ECCache.get``/``get_many`` read through here: CPU hits are copied out of the
pool on the calling thread (one ``clone``, the buffer released at once); hits
below the CPU tier (``reads.py``) are copied to the host as they are read, in
pinned memory on request, or to a device, several side by side
(``read_pool.py``). Each read holds at most one pool buffer until its copy is
made, so a batch larger than the CPU pool does not starve its own later reads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from lmcache.v1.memory_management import MemoryObj

from .. import codec
from ..key import ECKey
from ..metrics import ECStats
from .read_pool import ReadPool
from .reads import Prefetched, TierReader

_CPU = torch.device("cpu")
_USABLE_DEVICES: set[torch.device] = {_CPU}


def usable_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch device this process can put a tensor on; a clear
    ``ValueError`` otherwise, before any read or compute (checked once per device)."""
    if device == "cpu":
        return _CPU
    try:
        parsed = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a torch device: {exc}") from None
    if parsed in _USABLE_DEVICES:
        return parsed
    if parsed.type == "meta":  # holds no data: a "hit" there would return nothing
        raise ValueError("device 'meta' holds no data; ask for a real device")
    try:
        torch.empty(0, device=parsed)
    except (RuntimeError, AssertionError, AttributeError) as exc:
        raise ValueError(f"device {str(parsed)!r} is not usable here: {exc}") from None
    _USABLE_DEVICES.add(parsed)
    return parsed


class HitCopier:
    """One cache's copies of its hits into the tensors its callers receive."""

    def __init__(
        self, reader: TierReader, stats: ECStats, cpu_name: str, read_pool: ReadPool
    ) -> None:
        self._reader = reader
        self._stats = stats
        self._cpu_name = cpu_name
        self._read_pool = read_pool

    def to_host(
        self, key: ECKey, pin_memory: bool, prefetched: Prefetched | None = None
    ) -> torch.Tensor | None:
        """``key``'s tensor in host memory; any CPU-pool buffer is released on return."""
        started = time.perf_counter()
        if not pin_memory:
            out = self.cpu_hit_to_host(key, started)
            if out is not None:
                return out
        return self._walk_to_host(key, pin_memory, prefetched, started)

    def cpu_hit_to_host(self, key: ECKey, started: float) -> torch.Tensor | None:
        """A copy of ``key``'s CPU-tier buffer if its layout is known, else None
        (not there, or not known yet: ``_walk_to_host`` handles every other case).

        The common case, in as few steps as it takes: every step costs more
        than its size suggests, as the copies between two reads leave the
        caches cold.
        """
        cpu_hit = self._reader.read_cpu(key)
        if cpu_hit is None:
            return None
        memory_obj, payload = cpu_hit
        try:
            out = payload.tensor.clone()
        finally:
            memory_obj.ref_count_down()
            self._reader.done()
        self._stats.hit(self._cpu_name, payload.data.size, time.perf_counter() - started)
        return out

    def _walk_to_host(
        self, key: ECKey, pin_memory: bool, prefetched: Prefetched | None, started: float
    ) -> torch.Tensor | None:
        """``key``'s tensor from the first tier that has it, or None on a miss."""
        try:
            hit = self._reader.read(key, prefetched)
            if hit is None:
                self._stats.miss(time.perf_counter() - started)
                return None
            try:
                out = codec.copy_out(hit.payload, _CPU, False, pin_memory)
            finally:
                if hit.memory_obj is not None:
                    hit.memory_obj.ref_count_down()
        finally:
            self._reader.done()
        self._stats.hit(hit.tier, hit.payload.data.size, time.perf_counter() - started)
        return out

    def batch(
        self, keys: Sequence[ECKey], device: torch.device, pin_memory: bool = False
    ) -> list[torch.Tensor | None]:
        # Entries that no local tier holds come from the remote tier in one request.
        prefetched = self._reader.prefetch(keys) if len(keys) > 1 else None
        if device.type == "cpu":
            return self._batch_to_host(keys, pin_memory, prefetched)
        # To a CUDA device the copies leave the (pinned) pool asynchronously; the
        # buffers are released only after one synchronize, so none is reused early.
        async_copy = device.type == "cuda"
        results: list[torch.Tensor | None] = []
        held: list[MemoryObj] = []
        try:
            for key in keys:
                started = time.perf_counter()
                try:
                    hit = self._reader.read(key, prefetched)
                    if hit is None:
                        self._stats.miss(time.perf_counter() - started)
                        results.append(None)
                        continue
                    tier, memory_obj, payload = hit
                    if memory_obj is not None:
                        held.append(memory_obj)
                    out = codec.copy_out(payload, device, async_copy, pin_memory)
                    if not async_copy and memory_obj is not None:
                        # Copied already: free the buffer now, so a batch larger
                        # than the CPU pool does not starve its own later reads.
                        held.pop().ref_count_down()
                finally:
                    self._reader.done()
                results.append(out)
                self._stats.hit(tier, payload.data.size, time.perf_counter() - started)
            if async_copy and held:
                torch.cuda.current_stream(device).synchronize()
        finally:
            for memory_obj in held:
                memory_obj.ref_count_down()
        return results

    def _batch_to_host(
        self, keys: Sequence[ECKey], pin_memory: bool, prefetched: Prefetched | None
    ) -> list[torch.Tensor | None]:
        # CPU hits first, on the caller's thread: a copy out of the pool gains
        # nothing on a second thread (the copies into fresh memory then fault
        # in that thread's malloc arena). Reads below the CPU tier wait on
        # files and sockets, so those run side by side (``read_threads``).
        # Each read holds at most one pool buffer until its copy is made, so a
        # batch larger than the CPU pool does not starve its own later reads.
        results: list[torch.Tensor | None] = [
            None if pin_memory else self.cpu_hit_to_host(key, time.perf_counter()) for key in keys
        ]
        below = [index for index, out in enumerate(results) if out is None]
        walked = self._read_pool.map(
            lambda index: self._walk_to_host(
                keys[index], pin_memory, prefetched, time.perf_counter()
            ),
            below,
        )
        for index, out in zip(below, walked, strict=True):
            results[index] = out
        return results
