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
  (or drops) the pending promotion. A hit read before a purge or a ``remove``
  is served, never promoted after it.
- A frame that fails verification is removed from every tier and counted; the
  read is a miss. A tier that raises is counted and skipped.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, NoReturn

import numpy as np
import torch
from lmcache.v1.memory_management import MemoryObj

from .. import codec
from ..config import from_lmcache
from ..key import ECKey
from ..metrics import ECStats
from ..tier_contract import Tier, TierKind
from .manager import ECStorageManager
from .promotion import Promoter

_DROPS_REMEMBERED = 4096

logger = logging.getLogger(__name__)

_PAYLOAD = "_ec_payload"  # attribute holding a buffer's verified layout
_NOT_FETCHED: Any = object()  # a key that a prefetch did not ask for (or another read took)


class Hit(NamedTuple):
    tier: str
    memory_obj: MemoryObj | None  # a held CPU-pool buffer the caller releases, if any
    payload: codec.Payload


class Prefetched(NamedTuple):
    tier: Tier  # the tier the frames came from
    frames: dict[ECKey, bytes | None]  # None: that tier does not have the key
    purges: int  # purges begun when the frames were fetched (``TierReader.purge_begins``)


class _Dropped(Exception):
    """A corrupt entry was found and removed: the read is a miss."""


def frame_bytes(memory_obj: MemoryObj) -> torch.Tensor | None:
    """The bytes of a frame buffer, possibly followed by allocator padding.

    ``MemoryObj.tensor`` builds three views per call; frames carry their own
    lengths, so the pool slice itself (``raw_tensor``, None once invalidated)
    is enough.
    """
    raw = memory_obj.raw_tensor
    if raw is None:
        return None
    if raw.dtype == torch.uint8 and raw.dim() == 1:
        return raw
    return memory_obj.tensor


def remember_payload(memory_obj: MemoryObj, payload: codec.Payload) -> None:
    """Keep ``payload`` (verified, aliasing ``memory_obj``) for later CPU hits.

    Safe because LMCache builds a new memory object for every allocation: the
    layout lives and dies with the buffer it describes.
    """
    # Memory objects with __slots__ (none of LMCache's CPU ones) decode on each hit.
    with contextlib.suppress(AttributeError):
        setattr(memory_obj, _PAYLOAD, payload)


def known_payload(memory_obj: MemoryObj, key: ECKey) -> codec.Payload | None:
    """The layout ``remember_payload`` kept on ``memory_obj``, if it is ``key``'s."""
    payload = getattr(memory_obj, _PAYLOAD, None)
    return payload if payload is not None and payload.name == key.storage_name else None


def _in_put_tasks(tier: Tier, key: ECKey) -> bool:
    """Whether ``tier`` has a write of ``key`` accepted and not landed (LMCache's
    ``exists_in_put_tasks``: the disk writer's in-flight set, the remote's put_tasks)."""
    pending = getattr(tier, "exists_in_put_tasks", None)
    if pending is None:
        return False
    try:
        return bool(pending(key))
    except Exception:  # a plugin without it (NotImplementedError), or closed
        return False


class TierReader:
    def __init__(self, storage: ECStorageManager, stats: ECStats) -> None:
        self._storage = storage
        self._cpu = storage.cpu
        self._stats = stats
        self._promoter = Promoter(self._promote_from)
        # The caller is done with the last read (copied out or released);
        # bound here, not wrapped: one call less on every read.
        self.done = self._promoter.read_done
        # A read that began before a purge was applied, or while one is, may
        # hold a purged entry: it is served, but not promoted (written back).
        self._purge_lock = threading.Lock()
        # Entries whose drop was logged: one that cannot be removed (a read-only
        # directory) is dropped again at every read, logged once.
        self._drops_logged: dict[tuple[str, str], None] = {}
        self._drops_lock = threading.Lock()
        self._purges_begun = 0
        self._purges_applying = 0
        # How long ``remove`` waits for the key's writes in flight (close's bound).
        self._write_wait_s = from_lmcache(storage.config).close_timeout
        self._late_removals = 0  # removals waiting for a write to land (``remove``)
        self._closed = False

    def purge_begins(self) -> None:
        """A purge is being applied: promotions of reads begun before are not kept."""
        with self._purge_lock:
            self._purges_begun += 1
            self._purges_applying += 1

    def purge_ends(self) -> None:
        with self._purge_lock:
            self._purges_applying -= 1

    def purge_stamp(self) -> int:
        """What a read (or a computation) notes as it begins: -1 while a purge
        or removal is applied; compared after, whether one began meanwhile."""
        return -1 if self._purges_applying else self._purges_begun

    def settle(self, key: ECKey) -> None:
        """Finish a pending background promotion of ``key``, if any."""
        self._promoter.settle(key)

    def cancel(self, key: ECKey) -> None:
        """Drop a pending background promotion of ``key``, if any."""
        self._promoter.cancel(key)

    def remove(self, key: ECKey) -> bool:
        """Delete ``key`` from every tier; True if any held it.

        Writes of ``key`` already accepted (a put's disk write or upload still
        queued) would bring it back: they land first, waited for up to
        ``close_timeout``; one still in flight then is removed again once it
        lands (``_remove_when_landed``). A removal is a purge for the reads
        under way: a disk or remote hit of ``key`` read before it must not
        write the entry back into the CPU tier after it."""
        landed = self._wait_for_writes(key, self._write_wait_s)
        removed = self._remove_now(key)
        if not landed:
            self._remove_when_landed(key)
        return removed

    def _remove_now(self, key: ECKey) -> bool:
        self._promoter.cancel(key)  # a queued promotion must not bring it back
        self.purge_begins()
        try:
            return self._storage.remove(key) > 0
        finally:
            self.purge_ends()

    def writing(self, key: ECKey) -> list[str]:
        """The tiers below the CPU tier with a write of ``key`` accepted, not landed."""
        return [
            tier.name
            for tier in self._storage.every_tier()
            if tier is not self._cpu and _in_put_tasks(tier, key)
        ]

    def _wait_for_writes(self, key: ECKey, seconds: float) -> bool:
        """Whether no write of ``key`` is in flight in any tier within ``seconds``."""
        deadline = time.monotonic() + seconds
        while self.writing(key):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def _remove_when_landed(self, key: ECKey) -> None:
        """Remove ``key`` again, on a thread of its own, once its writes still in
        flight land (the rare removal that outwaited ``close_timeout``)."""
        with self._purge_lock:
            self._late_removals += 1
            first = self._late_removals == 1
        if first:  # one line per episode, not one per removal
            logger.warning(
                "remove(%s): a write of it still in flight to %s after close_timeout "
                "(%.1f s); removed again once it lands",
                key.to_string(),
                ", ".join(self.writing(key)) or "a tier",
                self._write_wait_s,
            )

        def again() -> None:
            try:
                while not self._closed and not self._wait_for_writes(key, 1.0):
                    pass
                if not self._closed:
                    self._remove_now(key)
            except Exception as exc:  # closed under it: nothing left to undo
                logger.debug("Removing %s again failed: %s", key.to_string(), exc)
            finally:
                with self._purge_lock:
                    self._late_removals -= 1

        threading.Thread(target=again, name="ec-remove-landed", daemon=True).start()

    def pending(self) -> int:
        """Background promotions queued or running."""
        return self._promoter.pending()

    def promote_now(self) -> int:
        """Run the queued promotions in the calling thread (see ``Promoter.run_pending``)."""
        return self._promoter.run_pending()

    def close(self, timeout: float) -> None:
        self._closed = True
        self._promoter.close(timeout)

    def read(self, key: ECKey, prefetched: Prefetched | None = None) -> Hit | None:
        """The first verified hit for ``key``, or None (miss, or corrupt and dropped).

        ``prefetched``: frames already fetched for a batch (``prefetch``).
        Every call is followed by one ``done()``, once the hit is copied out:
        promotions wait until then.
        """
        self._promoter.reading()
        self._promoter.settle(key)  # a read after a disk hit is a CPU hit
        purges = self.purge_stamp() if prefetched is None else prefetched.purges
        cpu = self._cpu
        try:
            if cpu.holds_entries:
                try:
                    memory_obj = cpu.get_blocking(key)
                except Exception as exc:
                    self.tier_failed(cpu, "get", exc)
                    memory_obj = None
                if memory_obj is not None:
                    return self._from_buffer(key, 0, cpu, memory_obj, purges)
            for level, tier in enumerate(self._storage.tiers()):
                if tier is not cpu:
                    hit = self._from_tier(key, level, tier, prefetched, purges)
                    if hit is not None:
                        return hit
        except _Dropped:
            pass
        return None

    def read_cpu(self, key: ECKey) -> tuple[MemoryObj, codec.Payload] | None:
        """A CPU-tier hit on a buffer whose layout is known: (held buffer, payload),
        or None, and the caller takes ``read``, which handles every other case.

        The hot path of ``get``: no tier walk, no pending promotion to settle
        (a key whose promotion is pending is not in the CPU tier yet). A hit
        counts as a read in progress, like ``read``: ``done()`` follows it.
        """
        cpu = self._cpu
        if not cpu.use_hot:  # holds_entries, without the property's call
            return None
        try:
            memory_obj = cpu.get_blocking(key)
        except Exception:
            return None  # ``read`` asks again and reports the failure
        if memory_obj is None:
            return None
        payload = known_payload(memory_obj, key)
        if payload is None:
            memory_obj.ref_count_down()
            return None
        self._promoter.reading()
        return memory_obj, payload

    def prefetch(self, keys: Sequence[ECKey]) -> Prefetched | None:
        """Frames of the ``keys`` no local tier holds, from the first tier beyond
        them in one request (Redis: ``MGET``); None when there is nothing to batch.

        Only existence is checked locally, so a batch larger than the CPU pool
        holds no pool memory here; ``read`` then walks each key as usual and
        takes its frame from the batch when it reaches that tier.
        """
        local = []
        for tier in self._storage.tiers():
            if not tier.kind.local:
                break
            local.append(tier)
        else:
            return None  # no remote tier
        if not tier.batched_reads:
            return None
        wanted = [key for key in dict.fromkeys(keys) if not self._held_locally(key, local)]
        if len(wanted) < 2:
            return None
        purges = self.purge_stamp()
        try:
            frames = tier.read_many(wanted)
        except Exception as exc:
            self.tier_failed(tier, "get", exc)
            return None
        return Prefetched(tier, dict(zip(wanted, frames, strict=True)), purges)

    @staticmethod
    def _held_locally(key: ECKey, local: list[Tier]) -> bool:
        for tier in local:
            try:
                if tier.contains(key):
                    return True
            except Exception:
                pass  # the read itself reports a failing tier
        return False

    def _from_tier(
        self, key: ECKey, level: int, tier: Tier, prefetched: Prefetched | None, purges: int
    ) -> Hit | None:
        try:
            data = _NOT_FETCHED
            if prefetched is not None and prefetched.tier is tier:
                # One pop, not a test then a pop: a batch's reads run on several threads.
                data = prefetched.frames.pop(key, _NOT_FETCHED)
            if data is _NOT_FETCHED:
                data = tier.read(key)
        except codec.CorruptEntryError as exc:  # the tier found the entry damaged
            self._drop(key, tier, exc)
        except Exception as exc:
            self.tier_failed(tier, "get", exc)
            return None
        if data is None:
            return None
        if isinstance(data, MemoryObj):
            return self._from_buffer(key, level, tier, data, purges)
        # Fresh memory: whole bytes (remote) or a frame read from a file (disk, node).
        from_bytes = isinstance(data, bytes)
        try:
            payload = codec.decode_bytes(data, key) if from_bytes else codec.decode_read(data, key)
        except Exception as exc:
            self._drop(key, tier, exc)
        if from_bytes:
            self._promote_bytes(key, data, payload, level, purges)
        elif level > 0:  # some tier above wants it
            self._promoter.submit(key, tier, self._cpu.stamp(), purges)
        return Hit(tier.name, None, payload)

    def _from_buffer(
        self, key: ECKey, level: int, tier: Tier, memory_obj: MemoryObj, purges: int
    ) -> Hit | None:
        payload = known_payload(memory_obj, key)
        if payload is None:
            buffer = frame_bytes(memory_obj)
            if buffer is None:
                memory_obj.ref_count_down()
                return None
            try:
                # A CPU-pool frame never left this process: its header suffices.
                verify = tier.kind is not TierKind.CPU
                payload = codec.decode_payload(buffer, key, verify_payload=verify)
            except Exception as exc:
                memory_obj.ref_count_down()
                self._drop(key, tier, exc)
            remember_payload(memory_obj, payload)
        if level > 0:
            self._write_above(key, memory_obj, self._storage.tiers()[:level], purges)
        return Hit(tier.name, memory_obj, payload)

    def _drop(self, key: ECKey, tier: Tier, exc: Exception) -> NoReturn:
        # Stored bytes are untrusted (shared disks and stores): whatever they
        # make the decoder raise, the answer is a miss, never an error.
        reason = exc.reason if isinstance(exc, codec.CorruptEntryError) else repr(exc)
        self._stats.add("integrity_failures")
        if self._first_drop(key, tier):
            logger.warning("Dropping corrupt entry %s from %s: %s", key, tier.name, reason)
        self.remove_everywhere(key, damaged_in=tier)
        raise _Dropped from None

    def _first_drop(self, key: ECKey, tier: Tier) -> bool:
        """Whether this entry's drop is news (the last 4096 drops are remembered)."""
        name = (tier.name, str(key))
        with self._drops_lock:
            if name in self._drops_logged:
                return False
            self._drops_logged[name] = None
            if len(self._drops_logged) > _DROPS_REMEMBERED:
                del self._drops_logged[next(iter(self._drops_logged))]
            return True

    # -- promotion -----------------------------------------------------------

    def _write_above(
        self,
        key: ECKey,
        memory_obj: MemoryObj,
        tiers: list[Tier],
        purges: int,
        since: int | None = None,
    ) -> None:
        """``memory_obj`` written to ``tiers``, unless a purge began after the
        read (``purges``: those begun when it began) or is being applied;
        ``since``: a late promotion, which takes its place in the CPU tier's
        use order as of that tick."""
        with self._purge_lock:  # a purge begins before or after these writes, not during
            if self._purges_applying or self._purges_begun != purges:
                return
            for tier in tiers:
                try:
                    if since is not None and tier is self._cpu:
                        self._cpu.write_used_at(key, memory_obj, since)
                    else:
                        tier.write(key, memory_obj)
                except Exception as exc:
                    self.tier_failed(tier, "promote", exc)

    def _promote_from(self, key: ECKey, source: Tier, since: int, purges: int) -> None:
        """On the promoter thread: read ``key`` again from ``source`` into the
        CPU pool, verify it and hand it to the tiers above. ``since``: the CPU
        tier's use tick when the caller read it; the pool buffer may evict only
        entries not used after that (``ECLocalCPUBackend.allocate_after``)."""
        tiers = self._storage.tiers()
        if source not in tiers:
            return  # bypassed or closed since
        above = tiers[: tiers.index(source)]
        if not above:
            return
        if self._cpu.holds_entries and self._cpu.contains(key):
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
                self._write_above(key, memory_obj, above, purges, since)
        except codec.CorruptEntryError:
            pass  # the next read of the entry finds it and drops it
        finally:
            memory_obj.ref_count_down()

    def _promote_bytes(
        self, key: ECKey, data: Any, payload: codec.Payload, level: int, purges: int
    ) -> None:
        """One copy of a verified frame into the CPU pool, for the tiers above ``level``."""
        above = self._storage.tiers()[:level]
        if not above:
            return
        size = len(data)
        memory_obj = self._cpu.allocate_frame(size)
        buffer = None if memory_obj is None else frame_bytes(memory_obj)
        if buffer is None:
            if memory_obj is not None:
                memory_obj.ref_count_down()
            return  # pool full right now: served, not promoted
        try:
            np.copyto(buffer.numpy()[:size], np.frombuffer(data, dtype=np.uint8))
            remember_payload(memory_obj, payload.over(buffer))
            self._write_above(key, memory_obj, above, purges)
        finally:
            memory_obj.ref_count_down()

    # -- shared with the rest of the engine -----------------------------------

    def remove_everywhere(self, key: ECKey, damaged_in: Tier) -> None:
        # Not StorageManager.remove: one tier failing (a read-only disk) must
        # neither stop the others nor reach the caller.
        for tier in self._storage.every_tier():
            try:
                if tier.name == damaged_in.name:
                    tier.remove_damaged(key)
                else:
                    tier.remove(key)
            except Exception as exc:
                self.tier_failed(tier, "remove", exc)

    def tier_failed(self, tier: Tier, operation: str, exc: Exception) -> None:
        self._stats.tier_error(tier.name)
        logger.warning("%s tier failed on %s: %s", tier.name, operation, exc)
