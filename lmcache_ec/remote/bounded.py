"""Reads of stored frames that never allocate more than a frame may be.

Every remote store reads an entry's value with a bound, so that a value
padded (or planted) far beyond its frame costs no memory:

- S3 reads the frame's prefix, then at most the size it declares plus one
  byte (decoding rejects any value that is not exactly its frame);
- Redis has no ranged read sized by the value's own bytes in one round trip,
  so it reads at most ``max_frame_bytes + 1`` (the CPU pool's size: no larger
  entry can be put or promoted by this reader) and decoding rejects the rest.

A frame that declares more than ``max_frame_bytes`` is too large for this
reader, not damaged: a miss, left in place for readers with larger pools.
"""

from __future__ import annotations

import logging

from ..codec import PREFIX_SIZE, CorruptEntryError, declared_size

logger = logging.getLogger(__name__)
_warned_too_large = False


def declared_or_none(head: bytes) -> int | None:
    """The size the frame starting with ``head`` declares; None if ``head`` is not
    a frame prefix (decoding then rejects the entry)."""
    try:
        return declared_size(head[:PREFIX_SIZE])
    except CorruptEntryError:
        return None


def too_large(name: str, declared: int, limit: int) -> None:
    """Log (once per process) a frame larger than this reader takes."""
    global _warned_too_large
    if not _warned_too_large:
        _warned_too_large = True
        logger.warning(
            "Remote entry %s declares %d bytes, more than this reader's largest frame "
            "(%d, the CPU pool's size): read as a miss (logged once)",
            name,
            declared,
            limit,
        )


def bounded_frame(name: str, data: bytes | None, limit: int) -> bytes | None:
    """A value read with at most ``limit + 1`` bytes (None: absent): None if its
    frame declares more than ``limit``; else ``data``, which decoding rejects
    unless it is exactly the frame it declares (a padded value arrives as
    ``limit + 1`` bytes, never more; an empty one is removed like any damage)."""
    if data is None or len(data) <= limit:
        return data
    declared = declared_or_none(data)
    if declared is not None and declared > limit:
        too_large(name, declared, limit)
        return None
    return data
