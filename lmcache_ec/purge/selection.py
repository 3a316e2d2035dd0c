"""What a listing or a purge selects, and the disk and remote tiers as seen from outside.

Shared by the engine (applying a purge another process made to this
process's tiers) and ``inventory`` (listing and purging from the CLI), so
the engine needs nothing from the layer above it.

Selection by namespace and model starts from the storage name (its slugs
carry a 32-bit hash of the exact strings, see ``key.py``), so a listing reads
only entries whose names match; as another name can share a slug, each named
entry's frame header then confirms the exact namespace and model (as it does
age and weights version). A header proves the identity only when that
identity hashes to the entry's name; an entry without such a header (damaged,
unreadable) is taken by its name, as any damaged entry is.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import codec
from ..config import ECConfig
from ..key import KEY_FORMAT_VERSION, ECKey, EncoderIdentity, slug
from ..tiers.disk_layout import DirectoryLayout, read_header_file


class RemoteUnavailable(RuntimeError):
    """The remote tier is configured but cannot be opened."""


@dataclass
class Entry:
    """One stored entry; ``header`` is None until read, ``error`` if unreadable;
    ``read_failed`` if the store failed to give its header (unknown, not damaged:
    a selection by age or weights cannot take it, and a purge says so)."""

    tier: str
    name: str
    size: int
    path: str | None = None
    mtime: float | None = None
    header: dict[str, Any] | None = None
    error: str | None = None
    read_failed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def created(self) -> float | None:
        """The header's creation time; else (none, or not a finite number: a
        store anyone can write to may hold any header) the file's mtime."""
        created = (self.header or {}).get("created")
        if type(created) in (int, float) and math.isfinite(created):
            return float(created)
        return self.mtime

    def age(self, now: float | None = None) -> float | None:
        created = self.created
        return None if created is None else (now or time.time()) - created


@dataclass(frozen=True)
class Selector:
    """Which entries a command acts on; empty fields match everything."""

    namespace: str | None = None
    model: str | None = None
    older_than: float | None = None  # seconds
    weights: str | None = None  # the header's ``weights`` field ("" for none)
    created_before: float | None = None  # epoch seconds (a purge applied later)

    @property
    def needs_headers(self) -> bool:
        return (
            self.namespace is not None  # a slug names a namespace only up to its tag
            or self.model is not None
            or self.older_than is not None
            or self.weights is not None
            or (self.created_before is not None)
        )

    def name_prefix(self) -> str:
        """The longest storage-name prefix shared by every selected entry."""
        prefix = f"ec{KEY_FORMAT_VERSION}."
        if self.namespace is None:
            return prefix
        prefix += slug(self.namespace) + "."
        return prefix + slug(self.model) + "." if self.model is not None else prefix

    def matches_name(self, name: str) -> bool:
        if not ECKey.is_storage_name(name):
            return False
        parts = name.split(".")
        if self.namespace is not None and parts[1] != slug(self.namespace):
            return False
        return self.model is None or parts[2] == slug(self.model)

    def matches_age(self, entry: Entry, now: float) -> bool:
        if self.older_than is None:
            return True
        age = entry.age(now)
        return age is not None and age >= self.older_than

    def matches_identity(self, entry: Entry) -> bool:
        """Whether the namespace and model that ``entry``'s header proves are the
        selected ones; an entry whose header proves none (damaged, unreadable,
        or stating an identity its name was not made from) is selected by its
        name, which has matched already."""
        if self.namespace is None and self.model is None:
            return True
        identity = proven_identity(entry)
        if identity is None:
            return True
        if self.namespace is not None and identity.namespace != self.namespace:
            return False
        return self.model is None or identity.model == self.model

    def matches_header(self, entry: Entry, now: float) -> bool:
        """Exact identity, age, weights and creation-time conditions (headers
        read where needed)."""
        if not self.matches_identity(entry):
            return False
        if not self.matches_age(entry, now):
            return False
        if self.created_before is not None:
            created = entry.created
            if created is None or created >= self.created_before:
                return False
        if self.weights is None:
            return True
        return entry.header is not None and str(entry.header.get("weights", "")) == self.weights


_IDENTITY_FIELDS = ("namespace", "model", "revision", "fingerprint", "dtype", "weights")


def proven_identity(entry: Entry) -> EncoderIdentity | None:
    """The identity ``entry``'s header states, if the entry's name was made from
    it (the digest covers the exact strings, so a header cannot claim another
    entry's name); None without a header, or with one that states anything else."""
    header = entry.header
    if header is None:
        return None
    try:
        identity = EncoderIdentity(**{f: header.get(f, "") for f in _IDENTITY_FIELDS})
        proven = identity.storage_name(header.get("mm_hash")) == entry.name
    except (TypeError, ValueError):  # a field that is no (non-empty) string
        return None
    return identity if proven else None


# -- disk ----------------------------------------------------------------------


def scan_disk(directory: str, selector: Selector = Selector(), tier: str = "disk") -> list[Entry]:
    """Entries of a disk (or node) tier directory whose names match (sizes from
    ``stat``), least recently used first. Temp files are neither listed nor removed."""
    return [
        Entry(tier, e.name, e.size, e.path, e.mtime_ns / 1e9)
        for e in DirectoryLayout(directory).scan(reclaim=False).entries
        if selector.matches_name(e.name)
    ]


def read_disk_header(entry: Entry) -> None:
    """Fill ``entry.header`` from the file's frame header (or ``entry.error``)."""
    assert entry.path is not None
    try:
        entry.header = read_header_file(entry.path)
    except codec.CorruptEntryError as exc:
        entry.error = exc.reason
    except OSError as exc:
        entry.error = f"unreadable: {exc.strerror or exc}"


def delete_disk(entry: Entry) -> bool:
    assert entry.path is not None
    try:
        os.remove(entry.path)
    except FileNotFoundError:
        return False
    return True


# -- remote --------------------------------------------------------------------


def open_remote(config: ECConfig) -> Any | None:
    """The catalog of ``config``'s ``remote_url`` store (the remote tier this
    module can inspect), None if it has none."""
    if config.remote.url is None:
        return None
    try:
        from ..remote.catalog import open_catalog
    except ImportError as exc:
        raise RemoteUnavailable(f"remote catalog support is not available: {exc}") from None
    try:
        return open_catalog(config)
    except Exception as exc:
        raise RemoteUnavailable(f"cannot open the remote tier: {exc}") from exc


def filter_headers(
    entries: Iterable[Entry], selector: Selector, now: float | None = None
) -> Iterator[Entry]:
    """Entries whose headers (read already) meet the identity, age, weights and
    creation conditions."""
    now = time.time() if now is None else now
    return (e for e in entries if selector.matches_header(e, now))
