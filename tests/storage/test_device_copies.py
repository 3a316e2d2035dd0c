"""Copies to an accelerator out of the page-locked CPU pool, with CUDA's stream
semantics modelled on the CPU (no GPU here): a ``non_blocking`` copy from
page-locked memory reads its source when the stream reaches it, so a pool
slot must not be reused before the stream has passed the copy. ``FakeStream``
queues each such copy and runs the queue at ``synchronize()``.

The pool itself is page-locked at its exact size (``cudaHostRegister``), never
through torch's pinned allocator, which rounds a block up to a power of two.
The CUDA runtime is faked to record what the pool asks of it.
"""

from __future__ import annotations

import pytest
import torch

import lmcache_ec.codec as codec
import lmcache_ec.storage.copy_out as hit_copies
import lmcache_ec.tiers.allocator as allocator
from lmcache_ec import ECCache
from lmcache_ec.tiers.allocator import HostPoolAllocator

A = torch.full((64, 512), 1.0, dtype=torch.bfloat16)
C = torch.full((64, 512), 3.0, dtype=torch.bfloat16)
CONFIG = {"max_local_cpu_size": 0.0625}


class FakeStream:
    def __init__(self) -> None:
        self.queue: list = []

    def synchronize(self) -> None:
        queue, self.queue = self.queue, []
        for copy in queue:
            copy()


@pytest.fixture
def stream(monkeypatch) -> FakeStream:
    """A CUDA device whose non-blocking copies from the pool run at synchronize()."""
    stream = FakeStream()

    def to_device(source: torch.Tensor, non_blocking: bool) -> torch.Tensor:
        out = torch.empty_like(source)  # the device's memory
        if non_blocking:
            stream.queue.append(lambda: out.copy_(source))  # read when the stream gets there
        else:
            out.copy_(source)
        return out

    real_copy_out = codec.copy_out

    def copy_out(payload, device, non_blocking, pin_memory=False):
        if device.type == "cuda":
            return to_device(payload.tensor, non_blocking and not payload.owned)
        return real_copy_out(payload, device, non_blocking, pin_memory)

    monkeypatch.setattr(codec, "copy_out", copy_out)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(hit_copies, "_USABLE_DEVICES", {torch.device("cpu"), torch.device("cuda")})
    stream.to_device = to_device
    return stream


def test_a_batch_to_the_device_is_read_before_its_slots_are_reused(stream):
    with ECCache.from_config(CONFIG, model="device/batch") as cache:
        cache.put("a", A)
        (got,) = cache.get_many(["a"], device="cuda")
        cache.remove("a")
        cache.put("c", C)  # the lowest free slot: a's
        stream.synchronize()
        assert torch.equal(got, A)


def test_a_borrowed_view_copied_to_the_device_is_read_before_its_slot_is_reused(stream):
    with ECCache.from_config(CONFIG, model="device/borrow") as cache:
        cache.put("a", A)
        with cache.borrow("a") as view:
            on_device = stream.to_device(view, non_blocking=True)
        cache.remove("a")
        cache.put("c", C)
        stream.synchronize()
        assert torch.equal(on_device, A)


class FakeCudart:
    def __init__(self, error: int = 0) -> None:
        self.error = error
        self.registered: list[int] = []
        self.unregistered: list[int] = []
        self.locked: int | None = None
        self.cleared = False

    def cudaHostRegister(self, pointer: int, size: int, flags: int) -> int:
        self.registered.append(size)
        self.locked = pointer if self.error == 0 else None
        return self.error

    def cudaGetLastError(self) -> int:
        self.cleared = True
        return self.error

    def cudaHostUnregister(self, pointer: int) -> int:
        self.unregistered.append(pointer)
        return 0


@pytest.fixture
def cuda_host(monkeypatch) -> FakeCudart:
    """A host with a CUDA device, whose runtime records the memory it locks."""
    cudart = FakeCudart()
    monkeypatch.setattr(allocator.torch_dev, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    return cudart


def test_the_pool_locks_exactly_its_size(cuda_host):
    size = 5 * 2**20 + 3 * 4096  # not a power of two
    pool = HostPoolAllocator(size)
    try:
        assert cuda_host.registered == [size] == [pool.size]
    finally:
        pool.close()
    assert cuda_host.unregistered == [cuda_host.locked]  # not left locked after close


def test_a_pool_the_host_will_not_lock_is_halved(cuda_host):
    cuda_host.error = 2  # cudaErrorMemoryAllocation
    with pytest.raises(RuntimeError, match="cudaHostRegister"):
        HostPoolAllocator(4 * allocator.MIN_POOL)
    assert cuda_host.registered[:2] == [4 * allocator.MIN_POOL, 2 * allocator.MIN_POOL]
    assert cuda_host.cleared  # no failure left for a later kernel launch to report
