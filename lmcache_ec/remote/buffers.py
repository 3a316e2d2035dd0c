"""Frame bytes in and out of LMCache CPU buffers, for every remote store's connector."""

from __future__ import annotations

from lmcache.v1.memory_management import MemoryObj

from ..codec import PREFIX_SIZE


def byte_view(memory_obj: MemoryObj) -> memoryview:
    """A flat, writable ``B`` view of a memory object's bytes."""
    view = memory_obj.byte_array
    view = view if isinstance(view, memoryview) else memoryview(view)
    return view.cast("B") if view.format != "B" else view


def frame_buffer_size(data: bytes) -> int:
    """Bytes to allocate for a stored value: at least a frame prefix.

    An empty (or tiny) value then reads as a truncated frame, which the engine
    counts and removes, instead of as a miss that stays in the store forever.
    """
    return max(len(data), PREFIX_SIZE)


def fill_frame_buffer(memory_obj: MemoryObj, data: bytes) -> None:
    view = byte_view(memory_obj)
    view[: len(data)] = data
    if len(view) > len(data):
        view[len(data) :] = bytes(len(view) - len(data))
