"""Listing and purging stored entries across tiers, from outside the serving process.

What can be seen from here:

- **disk**: every entry of the configured directory (``tiers/disk_layout.py``
  knows the file names); the frame header (identity, full mm_hash, shape,
  dtype, created time) is read from the first bytes of the file, the payload
  is never read.
- **node**: the same, for every namespace directory of this user's node tier
  on this machine (``node_tier``; ``tiers/node.py``).
- **remote**: through ``lmcache_ec.remote.catalog.open_catalog(config)``
  (Redis / S3 listing, header reads and deletes).
- **cpu**: lives inside the process that owns the ``ECCache``; ``scan_cpu``
  lists it for that process only.

Selection (``selection.py``) starts from the storage name and confirms the
exact namespace and model, and the age or weights version, from each named
entry's frame header.
Deleting a disk file under a running engine is safe: its next read of that
entry is a miss and the stale index entry is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..config import ECConfig
from ..tiers.disk_layout import DirectoryLayout
from .selection import (
    Entry,
    RemoteUnavailable,
    Selector,
    delete_disk,
    filter_headers,
    open_remote,
    read_disk_header,
    scan_disk,
)

__all__ = [
    "Entry",
    "RemoteUnavailable",
    "Selector",
    "delete",
    "delete_disk",
    "directory_usage",
    "filter_age",
    "filter_headers",
    "open_remote",
    "read_disk_header",
    "read_headers",
    "scan_cpu",
    "scan_disk",
    "scan_node",
    "scan_remote",
    "select",
]

_EVERYTHING = Selector()


def directory_usage(directory: str) -> dict[str, int]:
    """What a disk or node tier directory holds now, every process's entries
    included: entries, their bytes, and the bytes of writes in progress."""
    scan = DirectoryLayout(directory).scan(reclaim=False)
    return {
        "entries": len(scan.entries),
        "bytes": sum(e.size for e in scan.entries),
        "writing_bytes": scan.temp_bytes,
    }


def scan_node(config: ECConfig, selector: Selector = _EVERYTHING) -> list[Entry]:
    """Entries of this user's node tier on this machine, every namespace."""
    from ..tiers.node import node_dirs

    found: list[Entry] = []
    for directory in node_dirs(config.node_dir):
        found.extend(scan_disk(directory, selector, tier="node"))
    return found


# -- cpu (in-process) ----------------------------------------------------------


def scan_cpu(cache: Any, selector: Selector = _EVERYTHING) -> list[Entry]:
    """Entries of the CPU tier of ``cache`` (an ``ECCache`` in this process)."""
    found = []
    for key, size in cache._cpu.entries():
        name = key.to_string()
        if selector.matches_name(name):
            found.append(Entry("cpu", name, size))
    return found


# -- remote --------------------------------------------------------------------


def scan_remote(catalog: Any, selector: Selector = _EVERYTHING) -> list[Entry]:
    found = []
    for name, size in catalog.list(selector.name_prefix()):
        if selector.matches_name(name):
            found.append(Entry("remote", name, int(size)))
    return found


HEADER_READ_TRIES = 2  # a store failure is retried once: one slow moment is no unknown entry


def read_remote_header(catalog: Any, entry: Entry) -> None:
    """Fill ``entry.header``, or ``entry.error``; ``entry.read_failed`` when the
    store failed each try (its header is unknown: not damaged, not selected by it)."""
    for attempt in range(HEADER_READ_TRIES):
        try:
            header = catalog.read_header(entry.name, strict=True)
            break
        except Exception as exc:
            if attempt + 1 == HEADER_READ_TRIES:
                entry.error = f"header read failed: {exc}"
                entry.read_failed = True
                return
    if header is None:
        entry.error = "no readable header"
    else:
        entry.header = header


# -- both ----------------------------------------------------------------------


def read_headers(
    entries: Iterable[Entry], catalog: Any | None, advance: Callable[[], None] = lambda: None
) -> None:
    for entry in entries:
        if entry.tier in ("disk", "node"):
            read_disk_header(entry)
        elif entry.tier == "remote" and catalog is not None:
            read_remote_header(catalog, entry)
        advance()


def select(
    config: ECConfig,
    selector: Selector,
    *,
    tiers: Iterable[str] = ("node", "disk", "remote"),
    catalog: Any | None = None,
    problems: list[str] | None = None,
) -> list[Entry]:
    """Entries of the persistent tiers that match by name (headers not read).

    A remote listing that fails adds a message to ``problems`` (or raises
    ``RemoteUnavailable`` without it); the disk entries are still returned.
    """
    tiers = set(tiers)
    found: list[Entry] = []
    if "node" in tiers and config.node_tier:
        found.extend(scan_node(config, selector))
    if "disk" in tiers and config.local_disk:
        found.extend(scan_disk(config.local_disk, selector))
    if "remote" in tiers and catalog is not None:
        try:
            found.extend(scan_remote(catalog, selector))
        except Exception as exc:
            if problems is None:
                raise RemoteUnavailable(f"listing the remote tier failed: {exc}") from exc
            problems.append(f"remote tier skipped: listing failed: {exc}")
    return found


def filter_age(
    entries: Iterable[Entry], selector: Selector, now: float | None = None
) -> Iterator[Entry]:
    now = time.time() if now is None else now
    return (e for e in entries if selector.matches_age(e, now))


def delete(entry: Entry, catalog: Any | None) -> bool:
    """Delete one entry from its tier; True if it was there, False if it was
    not; raises if the tier failed (the entry may still be there, and served)."""
    if entry.tier in ("disk", "node"):
        return delete_disk(entry)
    if entry.tier == "remote" and catalog is not None:
        return bool(catalog.delete(entry.name, strict=True))
    raise ValueError(f"cannot delete from tier {entry.tier!r} outside its process")
