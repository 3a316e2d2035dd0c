"""``RemoteStore``: what every remote store offers, by storage name, synchronously.

One store class per URL scheme family (``redis_store``, ``s3_store``);
``open_store`` opens the one a URL names (``remote_names.STORES``). Both
users sit on top of it: the LMCache connector shim (``lmcache_connector.py``,
the serving path) and ``RemoteCatalog`` (scheduler, CLI).

Contract:

- every call is bounded by ``timeout`` (client socket/connect timeouts, one
  attempt; a pooled connection the server dropped is replaced once);
- failures raise (``OSError`` or the client's own errors); absence is
  ``False``/``None``, never an exception;
- ``ShardUnavailable`` (a ``StoreError``) means only part of a sharded store
  is down: the caller treats those entries as misses and the rest as healthy.
  Batched reads never raise it: they answer ``None`` for the lost entries.
  ``StoreBusy``, one of them, is a store refusing this call for now (S3's
  ``SlowDown``): a miss, not an outage;
- thread-safe: several threads may call one store.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..claims import owner_token
from ..remote_names import check_url, store_kind

if TYPE_CHECKING:
    from ..config import RemoteSettings


READ_BATCH = 32  # names a request of a batch read: one Redis pipeline, one bound


class StoreError(OSError):
    """The remote store failed a call."""


class ShardUnavailable(StoreError):
    """The shard holding the entry is down; other entries are unaffected."""


class StoreBusy(ShardUnavailable):
    """The store refused this call for now (throttled, a passing server error);
    other calls may pass: a miss, not an outage."""


@dataclass(frozen=True)
class Replication:
    """How far a store's writes reached its replicas (``RemoteStore.replicate``)."""

    acked: int  # replicas holding every write made before the call
    replicas: int  # replicas connected to the primary


class RemoteStore(abc.ABC):
    timeout: float
    # Called (from whichever thread made the call) when a shard that was
    # unavailable answers again: writes it missed can be re-sent.
    on_shard_back: Callable[[], None] | None = None

    # -- entries (frames) ------------------------------------------------------

    @abc.abstractmethod
    def exists(self, name: str) -> bool:
        """True if the entry ``name`` is stored."""

    def exists_many(self, names: Sequence[str]) -> list[bool | None]:
        """``exists`` of each name, in order; None where its shard is down."""
        return [self.exists(name) for name in names]

    @abc.abstractmethod
    def get(self, name: str) -> bytes | None:
        """The frame of entry ``name``; None if absent."""

    def get_many(self, names: Sequence[str]) -> list[bytes | None]:
        """``get`` of each name, in order, in as few round trips as the store allows;
        None where absent or where its shard is down."""
        return [self.get(name) for name in names]

    @abc.abstractmethod
    def put(self, name: str, data: bytes | memoryview) -> None:
        """Store the frame ``data`` as entry ``name`` (whole or not at all)."""

    @abc.abstractmethod
    def delete(self, name: str) -> bool:
        """Remove entry ``name``; True if it existed."""

    def delete_damaged(self, name: str) -> bool:
        """``delete`` of an entry whose bytes, as read, did not decode: the store
        may first confirm that they are the bytes it holds (``S3Store``)."""
        return self.delete(name)

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """(storage name, frame bytes) of entries whose name starts with ``prefix``.

        Yields only names of the store's entry layout; raises if any part of the
        store cannot be listed (a partial listing must not look complete).
        """

    @abc.abstractmethod
    def read_range(self, name: str, start: int, length: int) -> bytes | None:
        """Up to ``length`` bytes of the frame from ``start``; None if absent."""

    # -- logs (the purge log) and claims: objects that are not entries --------

    @abc.abstractmethod
    def read_log(self, name: str, size: int) -> bytes | None:
        """The last ``size`` bytes (or fewer) of the log ``name``; None if absent."""

    @abc.abstractmethod
    def append_log(self, name: str, line: bytes, limit: int) -> None:
        """Append ``line`` (one record ending in a newline) to the log ``name``
        atomically: appends made at the same time are all kept, in some order.
        The log keeps its newest whole lines within ``limit`` bytes (``appended``)."""

    def replicate(self, timeout_s: float) -> Replication | None:
        """Wait up to ``timeout_s`` for the store's replicas to hold every write
        made so far (from any connection); None where there is none to wait for."""
        return None

    @property
    def claim_owner(self) -> str:
        """Whose claims this store object makes: a token of its own (host, pid
        and a random part), so that it releases only what it claimed."""
        owner = self.__dict__.get("_claim_owner")
        if owner is None:
            owner = self.__dict__.setdefault("_claim_owner", owner_token())
        return owner

    @abc.abstractmethod
    def claim(self, name: str, ttl_s: float) -> bool:
        """Take the claim ``name`` for ``ttl_s`` seconds; False if someone else holds it.

        Announces work in flight (an encode) to other instances; an expired
        claim can be taken by anyone, and a claim already ours is renewed
        (True). Raises on failure.
        """

    @abc.abstractmethod
    def release(self, name: str) -> None:
        """Give up our claim ``name``; a claim another holder made meanwhile
        (ours expired and was taken over) is left alone. Raises on failure."""

    # -- lifecycle -------------------------------------------------------------

    @abc.abstractmethod
    def ping(self) -> None:
        """Return if the store answers; raise otherwise (health probe)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def abort(self) -> None:
        """Cut the connections in use, ending calls blocked on them (a caller
        gave up on a read); later calls connect again. Default: nothing to cut,
        an abandoned call ends at its socket timeout."""
        return None

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the store is, without credentials (for logs)."""


def appended(log: bytes, line: bytes, limit: int) -> bytes:
    """``log`` with ``line`` added, its oldest whole lines dropped to fit ``limit``
    bytes (``line`` itself is always kept). What every store's ``append_log``
    does, as one step."""
    if log and not log.endswith(b"\n"):
        log += b"\n"  # a damaged tail never swallows the new line
    data = log + line
    if len(data) > limit:
        cut = data.find(b"\n", len(data) - limit - 1, len(data) - len(line))
        data = data[cut + 1 :] if cut >= 0 else line
    return data


def open_store(settings: RemoteSettings) -> RemoteStore:
    """The store of ``settings.url``; does not contact the server.

    ``ValueError`` for a URL ``check_url`` refuses.
    """
    problem = check_url(settings.url)
    kind = store_kind(settings.url)
    if problem is not None or kind is None:
        raise ValueError(f"remote_url {problem}")
    factory = getattr(importlib.import_module(kind.module), kind.factory)
    return factory(settings)
