"""RemoteCatalog: what the remote tier holds, without an LMCache engine.

For processes that must look at the remote store but not serve from it: the
vLLM scheduler (existence checks before scheduling a load), the CLI (``ls``,
``purge``, ``stats``). A thin layer over the same store the serving path uses
(``store.open_store``), so it sees exactly what that path wrote, and it
allocates no LMCache memory pool.

Contract: every call is bounded by the config's ``remote_timeout`` (one
attempt, no retries; a reconnect happens on the next call), and each store
call is also waited for as a whole at most ``remote_timeout`` + 0.5 s
(``Deadline``: a server that answers a byte at a time is cut off then); a
listing, one step of about a page at a time. ``exists`` and
``delete`` return False and ``read_header`` returns None when the store fails
(with ``strict=True``, ``delete`` re-raises the store's error and
``read_header`` raises ``HeaderReadFailed``) or the entry is absent or
unreadable; ``claim`` returns True when the store fails, and for
``retry_interval`` after it failed (no call then: a hung server would hold
every claim for its timeout); ``list`` raises ``RemoteCatalogError`` (a
partial listing must not look complete). Thread-safe.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .. import codec
from .deadline import GRACE, Deadline
from .redis_store import _wrong_type
from .store import RemoteStore, Replication, open_store

if TYPE_CHECKING:
    from ..config import ECConfig

logger = logging.getLogger(__name__)

T = TypeVar("T")
HEADER_READ_AHEAD = 4096  # one ranged read covers the prefix and a typical header
READERS = 4  # threads running store calls, each bounded as a whole (``Deadline``)
# Entries taken from the store's listing per bounded step: one Redis SCAN batch
# (and its STRLEN pipeline), half an S3 page; one thread hand-off per step.
LIST_STEP = 500


class RemoteCatalogError(OSError):
    """The remote store could not be listed."""


class HeaderReadFailed(OSError):
    """The store failed while a header was read: the entry's header is unknown, not damaged."""


class RemoteCatalog:
    """Existence, listing, headers and deletion of entries in the remote tier."""

    def __init__(self, store: RemoteStore, retry_interval: float = 0.0) -> None:
        self.store = store
        self.timeout = store.timeout
        self._claims = _ClaimsBackoff(store.describe(), retry_interval)
        # Every answer is read whole within the timeout, not byte by byte.
        self._deadline = Deadline(self.timeout + GRACE, store.abort, READERS, "ec-catalog-read")
        self.last_error = ""  # why the last lookup_many raised, for the caller's log

    def exists(self, storage_name: str) -> bool:
        """True if the entry is stored; False if absent or on any error."""
        present = self.lookup(storage_name)
        if present is None:
            logger.warning("Remote lookup of %s failed", storage_name)
        return bool(present)

    def lookup(self, storage_name: str) -> bool | None:
        """True if stored, False if absent, None if the store could not answer."""
        try:
            return self._deadline.run(self.store.exists, storage_name)
        except Exception as exc:
            logger.debug("Remote exists(%s) failed: %s", storage_name, exc)
            return None

    def lookup_many(self, storage_names: list[str]) -> list[bool | None]:
        """``lookup`` of each name in as few round trips as the store allows."""
        self.last_error = ""
        try:
            return self._deadline.run(self.store.exists_many, storage_names)
        except Exception as exc:
            logger.debug("Remote exists of %d entries failed: %s", len(storage_names), exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return [None] * len(storage_names)

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """(storage name, frame bytes) of entries whose name starts with ``prefix``.

        Taken ``LIST_STEP`` at a time, each step bounded (``Deadline``): a
        server that drips a page of the listing fails it, it never hangs.
        """
        entries = self._listing_step(lambda: iter(self.store.list(prefix)))
        while step := self._listing_step(_take, entries, LIST_STEP):
            yield from step

    def _listing_step(self, call: Callable[..., T], *args: Any) -> T:
        try:
            return self._deadline.run(call, *args)
        except Exception as exc:
            raise RemoteCatalogError(f"listing the remote tier failed: {exc}") from exc

    def delete(self, storage_name: str, *, strict: bool = False) -> bool:
        """Remove the entry; True if it existed, False if absent or on error.

        With ``strict`` a store failure (no permission, a read-only replica, a
        timeout) raises instead: a purge must not count it as "was not there".
        """
        try:
            return self._deadline.run(self.store.delete, storage_name)
        except Exception as exc:
            if strict:  # the caller reports it (a purge: "cannot delete", exit 1)
                raise
            logger.warning("Remote delete(%s) failed: %s", storage_name, exc)
            return False

    def replicate(self) -> Replication | None:
        """Wait up to half of ``remote_timeout`` for the store's replicas to hold
        every write made so far; None without replicas; raises on failure."""
        return self._deadline.run(self.store.replicate, self.timeout / 2)

    def read_log(self, name: str, size: int) -> bytes | None:
        """The last ``size`` bytes of a log (the purge log); None if absent, raises on failure."""
        return self._deadline.run(self.store.read_log, name, size)

    def append_log(self, name: str, line: bytes, limit: int) -> None:
        """Append one line to a log, keeping its newest ``limit`` bytes; raises on failure."""
        self._deadline.run(self.store.append_log, name, line, limit)

    def claim(self, name: str, ttl_s: float) -> bool:
        """Announce work in flight under ``name`` for ``ttl_s`` seconds
        (``ClaimStore``); False if another holder's claim is live.

        True when the store cannot answer (or failed within ``retry_interval``):
        the caller then does the work itself instead of waiting on an
        announcement nobody could make.
        """
        return self.claim_many([name], ttl_s)[0]

    def claim_many(self, names: list[str], ttl_s: float) -> list[bool]:
        """``claim`` for several names: one round trip where the store offers it
        (Redis), else one call each. True for each the store could not answer."""
        if self._claims.down():
            return [True] * len(names)
        try:
            claim_many = getattr(self.store, "claim_many", None)
            if claim_many is None or len(names) == 1:
                won = [self._deadline.run(self.store.claim, name, ttl_s) for name in names]
            else:
                won = list(self._deadline.run(claim_many, names, ttl_s))
        except Exception as exc:
            self._claims.failed(exc)
            return [True] * len(names)
        self._claims.answered()
        return won

    def release(self, name: str) -> None:
        """Withdraw the claim ``name``; errors are logged (it expires anyway)."""
        if self._claims.down():
            return  # it expires
        try:
            self._deadline.run(self.store.release, name)
        except Exception as exc:
            self._claims.failed(exc)

    def read_header(self, storage_name: str, *, strict: bool = False) -> dict[str, Any] | None:
        """The verified frame header (``codec.read_header``), reading only its bytes.

        None if the entry is absent, unreadable or corrupt (a Redis key of
        another type included). When the store fails (a timeout, a lost
        connection): None, or with ``strict`` ``HeaderReadFailed``, so that a
        caller deciding by the header (a purge) can tell "unknown" from "damaged".
        """
        try:
            raw = self._deadline.run(self.store.read_range, storage_name, 0, HEADER_READ_AHEAD)
            if raw is None:
                return None
            header_len, *_ = codec.read_prefix(raw)
            needed = codec.PREFIX_SIZE + header_len
            if len(raw) < needed:
                rest = self._deadline.run(
                    self.store.read_range, storage_name, len(raw), needed - len(raw)
                )
                raw += rest or b""
            return codec.read_header(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        except codec.CorruptEntryError as exc:
            logger.info("Remote entry %s has an unreadable header: %s", storage_name, exc)
            return None
        except Exception as exc:
            if _wrong_type(exc):  # the store's answer about the entry: damage
                logger.info("Remote entry %s is a key of another type: %s", storage_name, exc)
                return None
            if strict:
                raise HeaderReadFailed(f"{type(exc).__name__}: {exc}") from exc
            logger.warning("Remote header read of %s failed: %s", storage_name, exc)
            return None

    def close(self) -> None:
        self._deadline.close()
        try:
            self.store.close()
        except Exception as exc:
            logger.debug("Closing the remote catalog: %s", exc)

    def __enter__(self) -> RemoteCatalog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_catalog(config: ECConfig) -> RemoteCatalog | None:
    """The catalog of ``config``'s ``remote_url`` store, or None when it has none.

    Opening does not contact the server; failures show up per call.
    """
    if config.remote.url is None:
        return None
    return RemoteCatalog(open_store(config.remote), config.remote.retry_interval)


def _take(entries: Iterator[T], count: int) -> list[T]:
    return list(itertools.islice(entries, count))


class _ClaimsBackoff:
    """Claims skipped for ``retry_interval`` after the store failed one: each
    claim of an outage would otherwise wait the store's timeout (a hung
    server), holding back every claim queued behind it. One WARNING per outage."""

    def __init__(self, store: str, retry_interval: float) -> None:
        self._store = store
        self._retry_interval = retry_interval
        self._down_until = 0.0
        self._outage = False

    def down(self) -> bool:
        return time.monotonic() < self._down_until

    def failed(self, exc: Exception) -> None:
        self._down_until = time.monotonic() + self._retry_interval
        if not self._outage:
            self._outage = True
            logger.warning(
                "Claims on %s failed (%s: %s): instances may encode an item more than "
                "once until it answers; retried every %.3g s",
                self._store,
                type(exc).__name__,
                exc,
                self._retry_interval,
            )

    def answered(self) -> None:
        if self._outage:
            self._outage = False
            logger.info("Claims on %s answered again", self._store)


__all__ = ["HeaderReadFailed", "RemoteCatalog", "RemoteCatalogError", "open_catalog"]
