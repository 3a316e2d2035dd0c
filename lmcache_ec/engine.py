"""ECCache: encoder outputs in LMCache's tiers, keyed by ``mm_hash``.

Contract:

- ``put`` validates, frames (``codec.py``) and hands the frame to LMCache's
  StorageManager: the CPU tier holds it before ``put`` returns; lower tiers
  are written in the background. ``close()`` waits until every accepted
  write has reached every tier, then stops the tiers: both within one
  ``close_timeout``.
- ``get`` walks the tiers in order (CPU → disk → remote). A hit below the CPU
  tier is verified (checksum, identity, shape) and then promoted into the
  tiers above it. A frame that fails verification is removed from every
  tier, counted, and reported as a miss. A tier that raises is skipped.
- The returned tensor is a private copy on the requested device.
- ``get_many`` reads the items below the CPU tier side by side
  (``read_threads``, ``storage/read_pool.py``); results keep the order asked.
- ``get_or_compute`` / ``get_or_compute_many``: the stored tensor, or
  ``compute``'s result stored and returned, computed once per entry in the
  process and, through claims in a tier the instances share, once across
  them (``storage/get_or_compute.py``; guarantees in docs/library.md).
- A purge by another process (``lmcache-ec purge``) is noticed through its
  namespace's purge log (``purge/marker.py``) within ``purge_check_s``: the CPU tier drops
  the entries the purge selected and the engine forgets what it knew of them
  (see ``_purged``).

Why the walk is here rather than ``StorageManager.get``: that method promotes
before anyone can verify, and does not say which tier answered.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

import torch
from lmcache.v1.event_manager import EventManager
from lmcache.v1.metadata import LMCacheMetadata

from . import codec
from .codec import validate_tensor
from .config import ECConfig, load_config
from .key import DTYPE_NAMES, ECKey, EncoderIdentity, dtype_name
from .metrics import ECStats
from .purge.follow import PurgeFollower
from .storage import ECStorageManager
from .storage.copy_out import HitCopier, usable_device
from .storage.get_or_compute import DEFAULT_WAIT_S, ComputeMany, GetOrCompute
from .storage.read_pool import ReadPool
from .storage.reads import TierReader, remember_payload
from .storage.reads import frame_bytes as _frame_bytes
from .storage.replay import RemoteReplayer

logger = logging.getLogger(__name__)

Items = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
Compute = Callable[[], torch.Tensor]

_KEY_MEMO_SIZE = 65536  # keys remembered by mm_hash (cleared when full)
_KEY_MEMO_MAX_LEN = 512  # longer mm_hashes are hashed on every call
_FORKED = "ECCache was opened before this process forked: open a new one in this process"
_opened: weakref.WeakSet[ECCache] = weakref.WeakSet()


def _closed_in_a_forked_child() -> None:
    # Its threads stayed in the parent: a call here could wait for ever.
    for cache in list(_opened):
        cache._closed, cache._closed_message = True, _FORKED


os.register_at_fork(after_in_child=_closed_in_a_forked_child)


def _lmcache_metadata(model: str) -> LMCacheMetadata:
    # LMCache sizes some remote buffers from kv_shape; encoder frames never use
    # it, but it has to be plausible. role="worker": the scheduler role has no
    # CPU tier in LMCache.
    return LMCacheMetadata(
        model_name=model,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(1, 2, 256, 1, 128),
        role="worker",
    )


class ECCache:
    """The encoder-output tier. Thread-safe; one per process and identity."""

    def __init__(self, config: ECConfig, identity: EncoderIdentity) -> None:
        if config.namespace != identity.namespace:
            # One namespace: the node tier's directory follows the keys'.
            config = replace(config, namespace=identity.namespace)
        self.config = config
        # The identity and its key memo, swapped together by set_identity: read
        # apart, a key of the old identity could land in the new memo.
        self._keying: tuple[EncoderIdentity, dict[str, ECKey]] = (identity, {})
        self.stats = ECStats()
        self._closed = False
        self._closed_message = "ECCache is closed"
        _opened.add(self)
        self._close_lock = threading.Lock()
        self._pool_was_full = False  # a full CPU pool is logged once per episode
        self._storage = ECStorageManager(
            config=config.to_lmcache(),
            metadata=_lmcache_metadata(identity.model),
            event_manager=EventManager(),
            lmcache_worker=None,
            async_lookup_server=None,
        )
        self._cpu = self._storage.cpu
        self._disk = self._storage.disk
        # local_cpu off and no other tier (configured so, or turned off at start).
        self._stores_nothing = not self._storage.tiers()
        if self._stores_nothing:
            logger.warning("No tier holds entries (local_cpu off, no other): nothing is stored")
        for tier in self._storage.every_tier():
            self.stats.watch_tier(tier.name, tier.snapshot)  # None: the tier keeps none
        self.stats.watch_features(self._storage.features_off)
        self._reader = TierReader(self._storage, self.stats)
        self._read_pool = ReadPool(config.read_threads)
        self._copier = HitCopier(self._reader, self.stats, self._cpu.name, self._read_pool)
        self._replayer = RemoteReplayer(
            self._storage,
            _frame_bytes,
            lambda: self._closed,
            read_purges=lambda: self._purges.read_remote_now(),  # made below, called later
        )
        self._replayer.attach()
        self._purges = PurgeFollower(
            config, identity.namespace, self._storage, self._reader, self.stats
        )
        self._watch = self._purges.watch  # polled on every read and write
        self._get_or_compute = GetOrCompute(
            self,
            config,
            self._read,
            check_open=self._check_open,
            check_fits=self._check_fits,
            purge_stamp=self._reader.purge_stamp,
        )

    @classmethod
    def from_config(
        cls,
        source: Any = None,
        *,
        model: str,
        revision: str | None = None,
        namespace: str | None = None,
        fingerprint: str = "",
        dtype: torch.dtype | str | None = None,
        weights: str | None = None,
    ) -> ECCache:
        """Build the tier from a YAML path, a dict, an ``ECConfig``, or ``None``
        (env, then default).

        ``dtype`` pins the encoder output dtype into the key (recommended when
        known); ``namespace`` overrides the config's ``namespace`` (for the keys
        and the node tier alike), ``weights`` its ``weights_version``.
        """
        config = load_config(source)
        if isinstance(dtype, torch.dtype):
            dtype = dtype_name(dtype)
        identity = EncoderIdentity(
            model=model,
            revision=revision or "",
            fingerprint=fingerprint,
            dtype=dtype or "",
            namespace=namespace if namespace is not None else config.namespace,
            weights=weights if weights is not None else config.weights_version,
        )
        return cls(config, identity)

    # -- introspection -------------------------------------------------------

    @property
    def cpu_capacity(self) -> int:
        """Bytes of the CPU pool: the largest frame the tier can take."""
        return self._cpu.capacity

    @property
    def identity(self) -> EncoderIdentity:
        """The identity reads and writes are keyed under (see ``set_identity``)."""
        return self._keying[0]

    @property
    def tiers(self) -> list[str]:
        return [tier.name for tier in self._storage.tiers()]

    def key(self, mm_hash: str) -> ECKey:
        # A key is a pure function of (identity, mm_hash) and its SHA-256 costs
        # more than a CPU-tier lookup; vLLM asks for the same items repeatedly.
        identity, memo = self._keying
        key = memo.get(mm_hash) if type(mm_hash) is str else None
        if key is None:
            key = identity.key(mm_hash)
            if len(mm_hash) <= _KEY_MEMO_MAX_LEN:
                if len(memo) >= _KEY_MEMO_SIZE:
                    memo.clear()
                memo[mm_hash] = key
        return key

    # -- writes --------------------------------------------------------------

    def set_identity(self, identity: EncoderIdentity) -> None:
        """Key later reads and writes under ``identity`` (e.g. new encoder weights).

        Entries stored under the previous identity stay where they are and are
        no longer found through this cache; tiers evict them as usual.
        ``ValueError`` for another namespace (``_check_namespace``).
        """
        self._check_namespace(identity)
        self._keying = (identity, {})

    def _check_namespace(self, identity: EncoderIdentity) -> None:
        # The purge watch and the node tier's directory follow one namespace.
        if identity.namespace != self.config.namespace:
            raise ValueError(
                f"identity of namespace {identity.namespace!r:.80}, not this cache's "
                f"{self.config.namespace!r:.80}: open one ECCache per namespace"
            )

    def put(
        self, mm_hash: str, tensor: torch.Tensor, *, identity: EncoderIdentity | None = None
    ) -> bool:
        """Store ``tensor`` under ``mm_hash``.

        ``identity``: the identity that produced ``tensor`` when it may differ
        from the cache's current one (a save queued before a weight update).
        Returns True when the entry is stored (or already was), False when it
        is not: the CPU pool has no room right now, or the node tier (when on)
        could not write it (full, I/O error). Raises ``TypeError``/``ValueError`` for
        input that can never be stored.
        """
        if identity is not None:
            self._check_namespace(identity)
        key = self.key(mm_hash) if identity is None else identity.key(mm_hash)
        validate_tensor(tensor, key.identity.dtype)  # the key's: set_identity may run meanwhile
        return self._put(key, tensor)

    def put_many(self, items: Items) -> list[bool]:
        """``put`` for several entries; all are validated before any is stored."""
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        prepared = []
        for mm_hash, tensor in pairs:
            key = self.key(mm_hash)
            validate_tensor(tensor, key.identity.dtype)
            header = codec.encode_header(key, tensor)
            self._check_fits(codec.frame_size(header, tensor))  # before anything is stored
            prepared.append((key, tensor, header))
        return [self._put(key, tensor, header) for key, tensor, header in prepared]

    def _check_fits(self, size: int) -> None:
        if size > self.cpu_capacity:
            self.stats.add("put_rejected")
            raise ValueError(
                f"entry of {size} bytes exceeds the CPU tier ({self.cpu_capacity} "
                "bytes, max_local_cpu_size); raise max_local_cpu_size"
            )

    def _put(self, key: ECKey, tensor: torch.Tensor, header: bytes | None = None) -> bool:
        self._check_open()
        self._watch.poll_disk()
        started = time.perf_counter()
        if header is None:
            header = codec.encode_header(key, tensor)
        size = codec.frame_size(header, tensor)
        self._check_fits(size)
        if self._stores_nothing:
            self.stats.add("put_rejected")
            return False
        if self._cpu.holds_entries and self._cpu.contains(key):
            self.stats.add("put_skipped_existing")
            return True
        memory_obj = self._cpu.allocate_frame(size)
        buffer = None if memory_obj is None else _frame_bytes(memory_obj)
        if memory_obj is None or buffer is None:
            self._pool_full(key)
            return False
        self._pool_was_full = False
        try:
            codec.write_frame(buffer[:size], header, tensor)
        except BaseException:
            memory_obj.ref_count_down()
            raise
        # CPU hits then copy out without decoding the frame again.
        remember_payload(memory_obj, codec.frame_payload(buffer, header, tensor, key.storage_name))
        self._storage.batched_put([key], [memory_obj])  # takes our reference
        node = self._storage.node
        if node is not None and not node.holds(key):
            # The node tier holds this node's host copy: its write failed (full,
            # I/O error; counted and logged by the tier), so nothing is stored.
            self.stats.add("put_rejected")
            return False
        self.stats.put(size, time.perf_counter() - started)
        return True

    def _pool_full(self, key: ECKey) -> None:
        """A put refused for want of a CPU-pool buffer: counted each time, logged
        once until a put is stored again (a full pool refuses every put)."""
        self.stats.add("put_rejected")
        if not self._pool_was_full:
            self._pool_was_full = True
            logger.warning(
                "CPU pool full: %s not stored; further puts are not stored (counted "
                "in put_rejected) until the pool has room",
                key,
            )

    def writing_below(self, key: ECKey) -> bool:
        """Whether a tier below the CPU tier still writes ``key`` (a claim on it
        is withdrawn only once that write has landed)."""
        return bool(self._reader.writing(key))

    def remove(self, mm_hash: str) -> bool:
        """Delete ``mm_hash`` from every tier; True if any tier held it."""
        self._check_open()
        return self._reader.remove(self.key(mm_hash))  # reads under way do not bring it back

    # -- reads ---------------------------------------------------------------

    def contains(self, mm_hash: str) -> str | None:
        """Name of the first tier holding ``mm_hash`` (``cpu``, ``disk``…), or None."""
        self._check_open()
        self._watch.poll_disk()
        key = self.key(mm_hash)
        self._reader.settle(key)  # answer after a pending promotion of it
        for tier in self._storage.tiers():
            try:
                if tier.contains(key):
                    return tier.name
            except Exception as exc:
                self._reader.tier_failed(tier, "contains", exc)
        return None

    def get(
        self, mm_hash: str, device: str | torch.device = "cpu", *, pin_memory: bool = False
    ) -> torch.Tensor | None:
        """The tensor stored under ``mm_hash`` on ``device``, or None on a miss.

        ``pin_memory`` (CPU results only, needs CUDA): return page-locked memory,
        so the caller's later copy to the GPU can be non-blocking.
        """
        # The steps of key() and _check_open() inline: each call costs a few µs
        # on the hot path, as the copies between two reads leave the caches cold.
        if self._closed:
            raise RuntimeError(self._closed_message)
        self._watch.poll_disk()
        key = self._keying[1].get(mm_hash) if type(mm_hash) is str else None
        if key is None:
            key = self.key(mm_hash)
        if device == "cpu":
            return self._copier.to_host(key, pin_memory)
        device = usable_device(device)
        if device.type == "cpu":
            return self._copier.to_host(key, pin_memory)
        return self._copier.batch([key], device, pin_memory)[0]

    @contextlib.contextmanager
    def borrow(self, mm_hash: str) -> Iterator[torch.Tensor | None]:
        """The tensor stored under ``mm_hash`` without a copy, or None on a miss;
        valid only inside the ``with`` block.

        For consumers that copy it onward anyway (to a device, into a larger
        batch). A CPU hit is a view of the pool buffer, held (neither evicted
        nor reused) until the block exits: read it, never write to it. With an
        accelerator the pool is page-locked, so a ``non_blocking`` copy to the
        device reads it later: the exit waits for the current stream first (a
        copy on another stream is the caller's to wait for). A hit below the
        CPU tier is the tensor read for this call.
        """
        self._check_open()
        self._watch.poll_disk()
        key = self.key(mm_hash)
        started = time.perf_counter()
        try:
            hit = self._reader.read(key)
            if hit is None:
                self.stats.miss(time.perf_counter() - started)
                yield None
                return
            self.stats.hit(hit.tier, hit.payload.data.size, time.perf_counter() - started)
            try:
                yield hit.payload.tensor
            finally:
                if hit.memory_obj is not None:
                    if torch.cuda.is_initialized():  # a copy onward may still read the slot
                        torch.cuda.current_stream().synchronize()
                    hit.memory_obj.ref_count_down()
        finally:
            self._reader.done()

    def get_many(
        self,
        mm_hashes: Sequence[str],
        device: str | torch.device = "cpu",
        *,
        pin_memory: bool = False,
    ) -> list[torch.Tensor | None]:
        """``get`` for several entries, in order; device copies are issued together.

        CPU hits are copied on the calling thread; the reads below the CPU tier
        run on up to ``read_threads`` threads, the calling one included.
        """
        return self._read([self.key(h) for h in mm_hashes], usable_device(device), pin_memory)

    def _read(
        self, keys: list[ECKey], device: torch.device, pin_memory: bool = False
    ) -> list[torch.Tensor | None]:
        """``get_many`` by key (get_or_compute's: under its call's identity)."""
        self._check_open()
        self._watch.poll_disk()
        return self._copier.batch(keys, device, pin_memory)

    # -- get or compute: single flight ---------------------------------------

    def get_or_compute(
        self,
        mm_hash: str,
        compute: Compute,
        *,
        device: str | torch.device = "cpu",
        wait_s: float = DEFAULT_WAIT_S,
    ) -> torch.Tensor:
        """The tensor stored under ``mm_hash``, or ``compute()``'s result, stored
        and returned.

        Callers of this process asking for the same entry at once share one
        ``compute`` call. Across instances sharing a tier (remote store, or a
        disk directory), the first to claim the entry computes it; the others
        wait for its output up to ``wait_s`` (also the claims' lifetime), then
        compute it themselves. ``compute`` raising releases the claim and raises
        in this caller only: callers waiting for it ask again (one of them
        computes). A result that is not a storable tensor of the key's dtype
        raises ``TypeError``/``ValueError``, and nothing is stored.
        """
        return self.get_or_compute_many(
            [mm_hash], lambda hashes: [compute()], device=device, wait_s=wait_s
        )[0]

    def get_or_compute_many(
        self,
        mm_hashes: Sequence[str],
        compute: ComputeMany,
        *,
        device: str | torch.device = "cpu",
        wait_s: float = DEFAULT_WAIT_S,
    ) -> list[torch.Tensor]:
        """``get_or_compute`` for several entries, in order: one lookup, one batch
        of claims and one look per pause for all of them; ``compute(hashes)``
        is called with the hashes this caller computes (once for what it claimed,
        once more for what its waits gave up on), and returns their tensors in
        that order."""
        self._check_open()
        if isinstance(mm_hashes, (str, bytes)):  # would be read as one hash per character
            raise TypeError("mm_hashes must be a sequence of hashes, not one string")
        if not (isinstance(wait_s, (int, float)) and math.isfinite(wait_s) and wait_s >= 0):
            raise ValueError(f"wait_s must be a finite number >= 0, got {wait_s!r}")
        return self._get_or_compute.run(mm_hashes, compute, usable_device(device), float(wait_s))

    # -- lifecycle -----------------------------------------------------------

    def promote_now(self) -> int:
        """Promote the disk and remote hits still queued for the CPU tier now, in
        the calling thread, rather than in the next quiet moment the background
        thread finds; the number promoted. For a caller that knows a moment
        when the work costs nobody (see ``Promoter.run_pending``)."""
        return self._reader.promote_now()

    def pending_writes(self) -> int:
        """Accepted writes not yet on every tier (disk and remote uploads, promotions)."""
        return self._reader.pending() + sum(
            tier.pending_writes() for tier in self._storage.every_tier()
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until accepted writes reach every tier; False on timeout."""
        deadline = time.monotonic() + (self.config.close_timeout if timeout is None else timeout)
        while self.pending_writes():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        return True

    def close(self, timeout: float | None = None) -> None:
        """Flush accepted writes, then release the tiers. Idempotent; returns
        within ``timeout`` seconds (default ``close_timeout``; what is still
        running then is left to finish). A caller closing more than the cache
        passes what is left of its own deadline."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        bound = self.config.close_timeout if timeout is None else max(timeout, 0.0)
        # One deadline for the flush and the stop alike: close() is bounded by it.
        deadline = time.monotonic() + bound
        self._purges.stop()
        claims = self._get_or_compute.take_claims()
        if not self.flush(max(deadline - time.monotonic(), 0.0)):
            logger.warning(
                "close(): %d writes still pending after %.1fs",
                self.pending_writes(),
                bound,
            )
        # LMCache's close can block on a remote connector; never let it hang us.
        closer = threading.Thread(
            target=self._close_storage, args=(deadline,), name="ec-close", daemon=True
        )
        try:
            closer.start()
        except RuntimeError:  # no thread now (a pids limit): closed here, unbounded
            self._close_storage(deadline)
        else:
            closer.join(timeout=max(deadline - time.monotonic(), 0.0))
            if closer.is_alive():
                logger.warning("close(): storage backends did not stop in time; leaving them")
        if claims is not None:  # after the flush: claims still held are withdrawn now
            claims.close(min(2.0, max(deadline - time.monotonic(), 0.0)))

    def _close_storage(self, deadline: float) -> None:
        self._purges.join(max(deadline - time.monotonic(), 0.0))
        self._read_pool.close()
        self._reader.close(max(deadline - time.monotonic(), 0.0))
        self._storage.close()
        # LMCache stops its event loop but leaves the loop's to_thread pool
        # (a non-daemon thread) running; stop it so close() leaves nothing behind.
        loop = self._storage.loop
        if not loop.is_running() and not loop.is_closed():
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def __enter__(self) -> ECCache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(self._closed_message)

    def __repr__(self) -> str:
        return f"ECCache(model={self.identity.model!r}, tiers={self.tiers})"


__all__ = ["DTYPE_NAMES", "ECCache", "validate_tensor"]
