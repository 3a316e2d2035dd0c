"""The tier contract: what the engine, the reader and the replayer may ask of a tier.

Every lmcache-ec tier (cpu, node, disk, each remote) implements ``Tier``; the
engine walks ``ECStorageManager.tiers()`` in order and never sniffs for
capabilities. Storage plugins that LMCache adds after our tiers are wrapped
in an adapter that implements the same contract from LMCache's public
``StorageBackendInterface`` (``get_blocking``/``contains``/``remove``).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from lmcache.v1.memory_management import MemoryObj

    from .codec import FrameRead
    from .key import ECKey


class TierKind(enum.Enum):
    """The kind of a tier; its ``value`` is the name users see for built-in tiers."""

    CPU = "cpu"  # this process's pool
    NODE = "node"  # one shared-memory copy per node
    DISK = "disk"
    REMOTE = "remote"
    PLUGIN = "plugin"  # an LMCache storage plugin, through the adapter

    @property
    def local(self) -> bool:
        """Held on this machine: a read never waits on a network."""
        return self in (TierKind.CPU, TierKind.NODE, TierKind.DISK)


@runtime_checkable
class Tier(Protocol):
    """One level of the hierarchy, as the engine uses it."""

    kind: TierKind
    name: str  # user-facing: "cpu", "disk", "remote", "remote-<plugin>", …
    backend_name: str  # the key in LMCache's ``StorageManager.storage_backends``
    batched_reads: bool  # ``read_many`` is one round trip, not a loop
    available: bool  # False while the tier is known to be down (remote)
    counters: Counter[str]  # the tier's own event counts, shown by ``snapshot``
    directory: str | None  # where a directory tier (disk, node) keeps its files
    # Called by a tier that comes back up (remote); the replayer sets it.
    on_recovered: Callable[[], None] | None

    def contains(self, key: ECKey, pin: bool = False) -> bool: ...

    def read(self, key: ECKey) -> bytes | FrameRead | MemoryObj | None:
        """The stored frame, unverified, or ``None`` on a miss; raises on I/O failure.

        Whole ``bytes`` (remote), a ``FrameRead`` of a file (disk, node), or
        a pool buffer (cpu, plugins)."""

    def read_many(self, keys: Sequence[ECKey]) -> list[bytes | FrameRead | MemoryObj | None]:
        """``read`` for several keys; one request where ``batched_reads``."""

    def read_into_pool(
        self, key: ECKey, allocate: Callable[[int], MemoryObj | None]
    ) -> MemoryObj | None:
        """The frame in a CPU-pool buffer, or ``None``: the tier's own buffer
        (cpu), else a copy into one from ``allocate`` (disk; promotion, replay)."""

    def write(self, key: ECKey, memory_obj: MemoryObj) -> None:
        """Store a verified frame buffer (promotion, replay); the tier takes its
        own reference. Lower tiers write in the background."""

    def remove(self, key: ECKey, force: bool = True) -> bool: ...

    def remove_damaged(self, key: ECKey) -> bool:
        """``remove`` of an entry read damaged from this tier (a remote store
        may first confirm the damage is in what it holds)."""

    def snapshot(self) -> dict[str, Any] | None:
        """Health and counters for ``stats``; ``None`` when the tier keeps none."""

    def pending_writes(self) -> int: ...

    def writes_in_flight(self) -> frozenset[ECKey]:
        """The keys of the writes accepted and not on the tier yet."""

    def take_missed(self) -> list[ECKey]:
        """Keys whose writes were lost while the tier was down (replayed on recovery)."""

    def remember_missed(self, keys: Sequence[ECKey]) -> None:
        """Give back keys a replay could not finish (the tier went down again)."""

    def forget_stored(self) -> None:
        """Drop any memory of what the tier already holds (after a purge)."""

    def close(self) -> None: ...


class TierDefaults:
    """What a tier that keeps no health, replay or promotion state answers."""

    batched_reads = False
    available = True
    directory: str | None = None
    on_recovered: Callable[[], None] | None = None

    def read_many(self, keys: Sequence[ECKey]) -> list[Any]:
        return [self.read(key) for key in keys]  # type: ignore[attr-defined]

    def read_into_pool(
        self, key: ECKey, allocate: Callable[[int], MemoryObj | None]
    ) -> MemoryObj | None:
        return None

    def write(self, key: ECKey, memory_obj: MemoryObj) -> None:
        # LMCache's StorageBackendInterface: every backend has it.
        self.batched_submit_put_task([key], [memory_obj])  # type: ignore[attr-defined]

    def remove_damaged(self, key: ECKey) -> bool:
        return self.remove(key)  # type: ignore[attr-defined]

    def snapshot(self) -> dict[str, Any] | None:
        return None

    def pending_writes(self) -> int:
        return 0

    def writes_in_flight(self) -> frozenset[ECKey]:
        return frozenset()

    def take_missed(self) -> list[ECKey]:
        return []

    def remember_missed(self, keys: Sequence[ECKey]) -> None:
        return None

    def forget_stored(self) -> None:
        return None
