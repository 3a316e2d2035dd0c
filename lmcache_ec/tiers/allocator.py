"""The CPU tier's memory pool.

LMCache's ``MixedMemoryAllocator`` zero-fills its whole pool at start-up on a
CPU-only host (seconds and GBs of RSS for the 5 GB default) and pins it with
the accelerator runtime otherwise. ``HostPoolAllocator`` keeps the same
allocation scheme (``TensorMemoryAllocator`` over one flat buffer) but takes
the buffer from ``torch.empty``, so start-up costs nothing. With an
accelerator the pool is page-locked, as upstream does, for fast
host-to-device copies.

With ``cpu_huge_pages`` an unpinned pool asks for transparent huge pages
(``MADV_HUGEPAGE``): on a 2-core VM a copy of 1.3 MB out of a 4 KiB-page pool
took 100 µs, 57 µs on huge pages. Off by default: a huge page's first touch
may wait for the kernel to compact memory (a cold-pool put of 4 MB took 1 ms
on a fresh host, 10 ms once memory was fragmented). Where THP is off the
advice fails and the pool keeps 4 KiB pages.

Pages of an unpinned pool are made resident by ``Prefaulter``, a background
thread that keeps ``PREFAULT_AHEAD`` bytes beyond the highest allocation so
far populated (Linux ``MADV_POPULATE_WRITE``: page tables filled, contents
untouched, so it never races with a frame being written). LMCache's address
manager hands out the lowest free block first, so the pool fills from its
start and a put rarely meets a page it has to fault in (about 1 µs per 4 KiB
page, most of a cold put); RSS grows with use plus the window, not with the
pool's size. Where the kernel lacks the call, pages fault on first use.

It stays a ``MixedMemoryAllocator`` (LMCache's ``LocalCPUBackend`` asserts
that type before evicting for a batch) built by its own constructor with an
empty arena; only the arena (``buffer``, ``size``, ``pin_allocator``) is ours.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from typing import Any

import lmcache.utils
import torch
from lmcache import torch_dev
from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
from lmcache.v1.memory_management import MemoryObj

from ..config_schema import GB

logger = logging.getLogger(__name__)

# LMCache's stats methods (``thread_safe``) hold one process-wide lock, and
# freeing a pool buffer calls one. A buffer dropped in a reference cycle is
# freed by the garbage collector (``MemoryObj.__del__``), which may run inside
# one of those methods, in the thread holding the lock: with a plain Lock that
# thread waits on itself for good (an engine step or a library call stalled).
# Re-entrant, the nested stats update runs. ``thread_safe`` reads the module
# global at each call; pinned in tests/upstream/test_lmcache_contract.py.
if not isinstance(lmcache.utils._shared_observability_lock, type(threading.RLock())):
    lmcache.utils._shared_observability_lock = threading.RLock()

PREFAULT_AHEAD = 128 * 1024**2  # populated beyond the highest allocation so far
_PREFAULT_STEP = 2 * 1024**2  # per madvise call, which holds the mmap lock malloc waits for
_MADV_HUGEPAGE = 14
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_PAGE = 4096
_HUGE_PAGE = 2 * 1024**2
MIN_POOL = 64 * 1024**2  # below this a pool the host refuses is an error, not a smaller pool


def _madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def advise_huge_pages(buffer: torch.Tensor) -> bool:
    """Ask for transparent huge pages on the 2 MiB-aligned part of ``buffer``;
    False where the kernel refuses (built without THP, not Linux). The kernel
    uses them where THP's mode is ``madvise`` or ``always``."""
    madvise = _madvise()
    if madvise is None:
        return False
    base = buffer.data_ptr()
    start = -(-base // _HUGE_PAGE) * _HUGE_PAGE
    end = (base + buffer.numel() * buffer.element_size()) // _HUGE_PAGE * _HUGE_PAGE
    if end <= start:
        return False
    return madvise(start, end - start, _MADV_HUGEPAGE) == 0


class Prefaulter:
    """Keeps the pages of ``buffer`` resident ahead of its allocations, on a
    daemon thread (ctypes releases the GIL during the call).

    Not niced: on a busy host a niced thread falls behind and the puts fault
    the pages in themselves; the work is bounded by the window either way."""

    def __init__(self, buffer: torch.Tensor, ahead: int = PREFAULT_AHEAD) -> None:
        self._madvise = _madvise()
        base = buffer.data_ptr()
        self._buffer = buffer  # kept alive while the thread works on it
        self._base = base
        self._start = -(-base // _PAGE) * _PAGE  # the first whole page
        self._end = (base + buffer.numel()) // _PAGE * _PAGE
        self._ahead = ahead
        self._done = self._start  # populated below this address
        self._target = min(self._end, self._start + ahead)
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        if self._madvise is None or self._end <= self._start:
            return
        self._wake.set()
        self._thread = threading.Thread(target=self._run, name="ec-prefault", daemon=True)
        self._thread.start()

    @property
    def populated(self) -> int:
        """Bytes of the buffer made resident so far."""
        return self._done - self._start

    def reached(self, end: int) -> None:
        """An allocation ends at byte ``end`` of the buffer."""
        # Whole pages: an unaligned target would leave ``_done`` unaligned, and
        # the next madvise from there fails (EINVAL), ending the prefault for good.
        target = min(self._end, -(-(self._base + end + self._ahead) // _PAGE) * _PAGE)
        # Woken once per eighth of the window, not once per allocation.
        if target - self._target > self._ahead // 8:
            self._target = target
            self._wake.set()

    def close(self, timeout: float = 1.0) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait()
            self._wake.clear()
            while self._done < self._target and not self._stopped:
                step = min(_PREFAULT_STEP, self._target - self._done)
                if self._madvise(self._done, step, _MADV_POPULATE_WRITE) != 0:
                    # Older kernel (EINVAL) or no memory now: first use faults pages in.
                    logger.debug("pool prefault stopped: errno %d", ctypes.get_errno())
                    return
                self._done += step


def _page_locked(size: int) -> torch.Tensor:
    """``size`` bytes page-locked for the accelerator's copies. Under CUDA
    (or ROCm) exactly ``size``, locked in place (``cudaHostRegister``):
    torch's pinned allocator rounds every block up to a power of two, so a
    5 GB pool would lock 8 GiB. Locked for the life of the process, as torch's
    cached pinned blocks are. ``RuntimeError`` when the host refuses."""
    if not torch.cuda.is_available():  # another accelerator: its runtime's pinning
        return torch.empty(size, dtype=torch.uint8, device="cpu", pin_memory=True)
    buffer = torch.empty(size, dtype=torch.uint8, device="cpu")
    cudart = torch.cuda.cudart()
    error = int(cudart.cudaHostRegister(buffer.data_ptr(), size, 0))
    if error != 0:
        clear = getattr(cudart, "cudaGetLastError", None)
        if clear is not None:  # else a later kernel launch check would report it
            clear()
        raise RuntimeError(f"cudaHostRegister of {size} bytes failed (cudaError {error})")
    return buffer


def _page_unlock(buffer: torch.Tensor) -> None:
    """Undo ``_page_locked`` (the pool's close): the memory stays valid for the
    entries still referencing it, as pageable memory."""
    try:
        torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())
    except Exception as exc:  # closing must not raise
        logger.debug("cudaHostUnregister failed: %s", exc)


def host_buffer(size: int, pinned: bool) -> torch.Tensor:
    """A ``size``-byte pool, or, when the host refuses that much (a
    ``max_local_cpu_size`` beyond its memory, or beyond what it can pin), the
    largest of its halves it grants, with one warning: a size no host can
    give must not keep the engine from starting. ``RuntimeError`` below
    ``MIN_POOL``."""
    wanted, refusal = size, None
    while True:
        try:
            # On the host whatever the caller's default device (torch.set_default_device).
            buffer = (
                _page_locked(size) if pinned else torch.empty(size, dtype=torch.uint8, device="cpu")
            )
        except RuntimeError as exc:
            if size // 2 < MIN_POOL:
                raise
            refusal, size = exc, size // 2 // _PAGE * _PAGE
            continue
        if refusal is not None:
            logger.warning(
                "CPU tier: max_local_cpu_size asks for %.1f GB, more than this host "
                "grants (%s); the tier uses %.1f GB",
                wanted / GB,
                str(refusal).splitlines()[0],
                size / GB,
            )
        return buffer


_in_pool = threading.local()  # ``active``: this thread is in ``HostPoolAllocator.allocate``


def allocating_from_pool() -> bool:
    """Whether this thread is allocating from an encoder-tier pool (not from a
    pool of LMCache's KV cache in the same process)."""
    return getattr(_in_pool, "active", False)


class HostPoolAllocator(MixedMemoryAllocator):
    def __init__(
        self, size: int, prefault_ahead: int = PREFAULT_AHEAD, huge_pages: bool = False
    ) -> None:
        super().__init__(0)  # a zero-byte arena costs nothing; ours replaces it
        pinned = torch_dev.is_available()
        # Upstream rounds every allocation up to align_bytes: past the last whole
        # unit no frame fits, and a frame that fits the pool only unrounded would
        # evict every entry and still fail (``ECCache._check_fits`` uses ``size``).
        align = self.align_bytes
        buffer = host_buffer(size // align * align, pinned)
        self.buffer = buffer[: buffer.numel() // align * align]  # its halves are too
        # Locked in place (``_page_locked``): unlocked at close, not left pinned for ever.
        self._locked = buffer if pinned and torch.cuda.is_available() else None
        self.size = self.buffer.numel()
        self.pin_allocator = TensorMemoryAllocator(self.buffer, align_bytes=self.align_bytes)
        # Page-locked memory comes from the accelerator runtime: its pages are its own.
        self.huge_pages = not pinned and huge_pages and advise_huge_pages(self.buffer)
        self.prefaulter: Prefaulter | None = None
        if not pinned and prefault_ahead > 0:  # page-locked memory is resident already
            self.prefaulter = Prefaulter(self.buffer, prefault_ahead)

    def allocate(self, shapes: Any, dtypes: Any, *args: Any, **kwargs: Any) -> MemoryObj | None:
        _in_pool.active = True
        try:
            memory_obj = super().allocate(shapes, dtypes, *args, **kwargs)
        finally:
            _in_pool.active = False
        if memory_obj is not None and self.prefaulter is not None:
            meta = memory_obj.meta
            self.prefaulter.reached(meta.address + meta.phy_size)
        return memory_obj

    def used_bytes(self) -> int:
        """Bytes handed out (aligned sizes), freed or not yet reused excluded."""
        return self.pin_allocator.total_allocated_size

    def close(self) -> None:
        # Not upstream's: it frees the arena with the allocator it came from.
        # Ours is an ordinary tensor: entries still referenced keep it alive,
        # and it is released with the last of them.
        if self.prefaulter is not None:
            self.prefaulter.close()
        locked, self._locked = self._locked, None
        if locked is not None:
            _page_unlock(locked)

    def __str__(self) -> str:
        return "HostPoolAllocator"
