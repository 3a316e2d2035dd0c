"""Claims: "this instance is encoding that item", announced in a shared store.

Instances sharing tiers use them so one new image is encoded once, not once
per instance it reaches while the first still encodes it: the first to
``claim`` an item's storage name encodes it; the others wait for its output
to land (at most their own bound) and then load it.

A claim is a hint, never a lock. It expires after its ``ttl_s``, so a holder
that dies holds nobody up past the TTL; an expired claim is taken over by the
next claimant. At worst (a store that fails, so the claimant works anyway)
two instances encode the same item: a duplicate, never a wrong tensor.

A claim names its owner, and only the owner releases it: a holder too slow
to release before its claim expired and was taken over leaves the new
holder's claim alone (compare-and-delete). Claiming what one already holds
renews it.

``ClaimStore`` is what the scheduler needs; ``DirectoryClaims`` keeps claims
as files in a directory (one node, or a directory every node mounts). Remote
stores offer the same two methods (a Lua script on Redis, conditional puts
and deletes on S3).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import queue
import secrets
import socket
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .flocks import flock_within

logger = logging.getLogger(__name__)


def claims_dir_for(disk_dir: str) -> str:
    """Claims of instances sharing the disk tier ``disk_dir``: a directory beside
    it (``<disk_dir>.claims``), so nothing that lists the tier meets them."""
    return os.path.normpath(disk_dir) + ".claims"


def claims_inside(disk_dir: str) -> str:
    """Where the claims go when the directory beside ``disk_dir`` cannot be made:
    ``<disk_dir>/.claims`` (a dot directory, which the tier never lists)."""
    return os.path.join(disk_dir, ".claims")


def open_directory_claims(disk_dir: str, group_shared: bool) -> DirectoryClaims:
    """The claims of the disk tier ``disk_dir``: beside it, or inside it where
    its parent cannot be written (a directory made for a service by root);
    once inside, inside for every later process."""
    inside = claims_inside(disk_dir)
    if not os.path.isdir(inside):
        try:
            return DirectoryClaims(claims_dir_for(disk_dir), group_shared=group_shared)
        except OSError as exc:
            logger.info("Claims beside %s cannot be made (%s): kept inside it", disk_dir, exc)
    return DirectoryClaims(inside, group_shared=group_shared)


_SUFFIX = ".claim"
_MAX_BYTES = 4096
# Holders keep the directory's lock for a read and a rename; one that keeps it
# longer (stopped, or a hung mount) costs a duplicate encode, never a wait.
_LOCK_WAIT_S = 0.1
_SWEEP_EVERY_S = 60.0  # expired claim files of dead holders are removed this often


@runtime_checkable
class ClaimStore(Protocol):
    def claim(self, name: str, ttl_s: float) -> bool:
        """Announce that this process works on ``name`` for ``ttl_s`` seconds.

        Returns True if the claim is now ours (free, expired, or already ours:
        then it is renewed for ``ttl_s``), False while another holder's claim
        is live. Never raises for a store failure: the caller then simply
        works on ``name`` (returns True).
        """
        ...

    def release(self, name: str) -> None:
        """Withdraw our claim on ``name``. A claim that is not ours (ours
        expired and another took it over) is left alone: compare-and-delete."""
        ...


def owner_token() -> str:
    """Who holds a claim: host, process and a random part (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class DirectoryClaims:
    """Claims as files ``<directory>/<name>.claim`` holding owner and expiry.

    A free claim is made by hard-linking a complete private file into place:
    exclusive like ``O_EXCL`` and never seen half-written, so of two claimants
    one wins. Every change to an existing claim (a takeover of an expired one,
    a renewal, a release, the sweep) is made under an ``flock`` on the
    directory, as the purge log's appends are, and replaces or removes the
    file in one step, so a claim is never absent while it changes hands and no
    third claimant slips in. The kernel frees the lock if its holder dies.
    Expiry is wall-clock time (``time.time``): clocks of nodes sharing the
    directory must roughly agree (within a TTL).

    ``group_shared`` (the disk tier's ``local_disk_group_shared``): the
    directory is made 2770 and the files 0660, so users of one group share
    claims as they share the tier; else 0700 and 0600. A file that is no
    regular file (a FIFO, a symlink) reads as an expired claim, never blocks.
    """

    def __init__(
        self, directory: str, owner: str | None = None, *, group_shared: bool = False
    ) -> None:
        self.directory = directory
        self.owner = owner or owner_token()
        self._file_mode = 0o660 if group_shared else 0o600
        self._next_sweep = 0.0
        self._threads = threading.Lock()  # an flock does not exclude this process's threads
        self._warned = False
        _make_directory(directory, 0o2770 if group_shared else 0o700)

    def _path(self, name: str) -> str:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"not a claim name: {name!r:.80}")
        return os.path.join(self.directory, name + _SUFFIX)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._threads:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                flock_within(fd, _LOCK_WAIT_S, "claims directory")
                yield
            finally:
                os.close(fd)  # releases the flock

    def _ours_to_take(self, held: tuple[str, float]) -> bool:
        """Ours (then renewed) or expired (then taken over)."""
        owner, expires = held
        return owner == self.owner or time.time() >= expires

    def claim(self, name: str, ttl_s: float) -> bool:
        path = self._path(name)
        try:
            self._sweep()
            if self._create(path, ttl_s):
                return True
            held = _read(path)
            if held is not None and not self._ours_to_take(held):
                return False  # another's, live: saying so needs no lock
            with self._locked():
                held = _read(path)
                if held is None:
                    return self._create(path, ttl_s)  # released meanwhile
                if not self._ours_to_take(held):
                    return False  # taken over meanwhile
                os.replace(self._record(path, ttl_s), path)  # never absent, never torn
                return True
        except PermissionError as exc:
            self._warn_once(exc)
            return True
        except OSError as exc:
            logger.debug("Claim of %.40s not made (%s); working on it anyway", name, exc)
            return True

    def _warn_once(self, exc: OSError) -> None:
        """A directory this user may not write (another user's, or not shared
        with its group): every claim is "ours", so say so once, not per claim."""
        if not self._warned:
            self._warned = True
            logger.warning(
                "Claims in %s cannot be made (%s): instances sharing the disk tier may "
                "encode an item more than once (local_disk_group_shared for users of a group)",
                self.directory,
                exc,
            )

    def release(self, name: str) -> None:
        path = self._path(name)
        held = _read(path)
        if held is None or held[0] != self.owner:
            return  # not ours: never touched
        try:
            with self._locked():
                # Checked again under the lock: ours may have expired and been
                # taken over since; that claim stays.
                held = _read(path)
                if held is not None and held[0] == self.owner:
                    os.unlink(path)
        except OSError as exc:
            logger.debug("Release of %.40s not made (%s); it expires", name, exc)

    def _record(self, path: str, ttl_s: float) -> str:
        """A complete claim record of ours in a new private file beside ``path``."""
        record = json.dumps({"owner": self.owner, "expires": time.time() + ttl_s}).encode()
        aside = f"{path}.{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(aside, flags, self._file_mode)
        try:
            os.fchmod(fd, self._file_mode)  # the umask may have taken group bits
            os.write(fd, record)
        finally:
            os.close(fd)
        return aside

    def _create(self, path: str, ttl_s: float) -> bool:
        """Create the claim file, complete, iff none exists (written aside, then linked)."""
        aside = self._record(path, ttl_s)
        try:
            os.link(aside, path)  # atomic and exclusive, like O_EXCL, and never half-written
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(aside)

    def _sweep(self) -> None:
        """Remove claim files long expired (holders that died), now and then.
        Housekeeping only: a sweep that cannot run (the lock held past its
        bound, an unreadable directory) is skipped and never decides a claim."""
        now = time.time()
        if now < self._next_sweep:
            return
        self._next_sweep = now + _SWEEP_EVERY_S
        try:
            with self._locked(), os.scandir(self.directory) as scan:
                for entry in scan:
                    if entry.name.endswith((_SUFFIX, ".tmp")):
                        self._sweep_entry(entry, now)
        except OSError as exc:
            logger.debug("Claims sweep of %s skipped (%s)", self.directory, exc)

    @staticmethod
    def _sweep_entry(entry: os.DirEntry, now: float) -> None:
        try:
            if entry.name.endswith(_SUFFIX):
                held = _read(entry.path)
                stale = held is not None and held[1] < now
            else:  # a record being written, or one of a claimant that died
                stale = entry.stat(follow_symlinks=False).st_mtime < now - _SWEEP_EVERY_S
            if stale:
                os.unlink(entry.path)
        except OSError:
            pass  # gone meanwhile, or not ours to remove


def _make_directory(path: str, mode: int) -> None:
    """``path`` (and its parents) made with ``mode`` past the umask; one that
    exists is left as it is (as the disk tier's ``make_directory``)."""
    try:
        os.makedirs(path, mode=mode)
    except FileExistsError:
        return
    os.chmod(path, mode)  # the umask may have taken group bits; mkdir drops setgid


# Never follows a link nor waits for a FIFO's writer: a stray or hostile file
# named like a claim would otherwise hang the claims thread of every instance.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _read(path: str) -> tuple[str, float] | None:
    """(owner, expires) of a claim file; None if absent. Garbage (and anything
    not a regular file: a FIFO, a symlink, a socket) reads as expired."""
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        return None
    if data is None:
        return "", 0.0
    try:
        record = json.loads(data)
        return str(record["owner"]), float(record["expires"])
    except (ValueError, KeyError, TypeError):
        return "", 0.0


def _read_regular(path: str) -> bytes | None:
    """The first bytes of the regular file ``path``; None if it is none."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symlink (O_NOFOLLOW), a socket
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _MAX_BYTES)
    finally:
        os.close(fd)


class ClaimAgent:
    """Claims made and released by a background thread: callers never wait on the store.

    ``ask(name)`` starts a claim and returns None until the store answered,
    then the answer once (True: ours). The store is opened in the thread
    (it may be remote); a store that raises counts as "ours" — encode as
    without claims. Claims asked together (``ask_many``, or queued while the
    thread was busy) go to the store as one batch: one round trip where the
    store offers ``claim_many`` (Redis). ``release(name, after=...)`` defers a
    release until ``after()`` holds (the output reached the shared tiers), at
    most ``within_s``, so that nobody who then claims finds nothing to load.
    """

    # Answers nobody collected (requests gone) are dropped oldest first beyond
    # this many, once older than the longest a caller takes to collect one.
    _MAX_ANSWERS = 4096
    _ANSWER_KEPT_S = 60.0
    _DEFERRED_POLL_S = 0.002  # how often deferred releases are checked

    def __init__(self, open_store: Callable[[], ClaimStore | None], ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._pending: set[str] = set()
        self._answers: OrderedDict[str, tuple[bool, float]] = OrderedDict()  # (won, when)
        self._queue: queue.SimpleQueue[_Order | None] = queue.SimpleQueue()
        self._deferred: list[tuple[str, Callable[[], bool], float]] = []  # this thread's only
        self._held: set[str] = set()  # won, not released: withdrawn at close (this thread's)
        self._no_store = False  # no store to share: every claim is ours at once
        self._thread = threading.Thread(
            target=self._loop, args=(open_store,), name="ec-claims", daemon=True
        )
        self._thread.start()

    @property
    def shared(self) -> bool:
        """False once it is known that no store is shared: every claim is ours."""
        return not self._no_store

    def ask(self, name: str, ttl_s: float | None = None) -> bool | None:
        return self.ask_many([name], ttl_s)[0]

    def ask_many(self, names: Sequence[str], ttl_s: float | None = None) -> list[bool | None]:
        """``ask`` for several names; the new claims among them go out as one batch."""
        if self._no_store:
            return [True] * len(names)
        answers: list[bool | None] = []
        new: list[str] = []
        with self._lock:
            for name in names:
                if name in self._answers:
                    answers.append(self._answers.pop(name)[0])
                    continue
                answers.append(None)
                if name not in self._pending:
                    self._pending.add(name)
                    new.append(name)
        if new:
            self._queue.put(_Order("claim", tuple(new), self.ttl_s if ttl_s is None else ttl_s))
        return answers

    def wait_answer(self, name: str, timeout: float) -> None:
        self.wait_answers([name], timeout)

    def wait_answers(self, names: Sequence[str], timeout: float) -> None:
        """Wait until the store answered every claim asked of ``names``, at most ``timeout``."""
        with self._answered:
            self._answered.wait_for(lambda: self._pending.isdisjoint(names), timeout)

    def release(
        self, name: str, after: Callable[[], bool] | None = None, within_s: float = 0.0
    ) -> None:
        """Withdraw the claim on ``name`` — once ``after()`` holds, if given (at
        most ``within_s`` later: then it is withdrawn anyway)."""
        self._queue.put(_Order("release", (name,), within_s, after))

    def _loop(self, open_store: Callable[[], ClaimStore | None]) -> None:
        try:
            store = open_store()
        except Exception as exc:
            logger.warning("Claim store unavailable; every instance encodes: %s", exc)
            store = None
        self._no_store = store is None
        while True:
            orders = self._next_orders()
            if orders is None:
                break
            for order in orders:
                self._carry_out(store, order)
            self._release_ready(store, final=False)
        self._release_ready(store, final=True)
        # Claims whose caller was still computing at close: its result is not
        # stored, and its release would come after this thread is gone.
        for name in list(self._held):
            self._release(store, name)
        close = getattr(store, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()

    def _next_orders(self) -> list[_Order] | None:
        """The orders queued now (at least one, unless a deferred release is due
        first: then maybe none); None once closed."""
        try:
            first = self._queue.get(timeout=self._DEFERRED_POLL_S if self._deferred else None)
        except queue.Empty:
            return []
        if first is None:
            return None
        orders = [first]
        with contextlib.suppress(queue.Empty):
            while len(orders) < 256:
                order = self._queue.get_nowait()
                if order is None:
                    self._queue.put(None)  # closing: after these
                    break
                orders.append(order)
        # Claims of one TTL queued one after another go to the store as one
        # batch; the order of claims and releases is kept.
        merged: list[_Order] = []
        for order in orders:
            last = merged[-1] if merged else None
            if (
                last is not None
                and order.action == last.action == "claim"
                and order.seconds == last.seconds
            ):
                merged[-1] = _Order("claim", last.names + order.names, order.seconds)
            else:
                merged.append(order)
        return merged

    def _carry_out(self, store: ClaimStore | None, order: _Order) -> None:
        if order.action == "release":
            if order.after is None:
                self._release(store, order.names[0])
            else:
                deadline = time.monotonic() + order.seconds
                self._deferred.append((order.names[0], order.after, deadline))
            return
        won = [True] * len(order.names)
        if store is not None:
            try:
                claim_many = getattr(store, "claim_many", None)
                if claim_many is not None and len(order.names) > 1:
                    won = [bool(w) for w in claim_many(list(order.names), order.seconds)]
                else:
                    won = [bool(store.claim(name, order.seconds)) for name in order.names]
            except Exception as exc:  # a store should not raise; encode if it does
                logger.debug("Claim store failed (claim): %s", exc)
        now = time.monotonic()
        self._held.update(name for name, answer in zip(order.names, won, strict=True) if answer)
        with self._lock:
            for name, answer in zip(order.names, won, strict=True):
                self._pending.discard(name)
                self._answers[name] = (answer, now)
            # A batch of more than _MAX_ANSWERS keys collects its answers after
            # they all came: none dropped before then (taken for a won claim).
            while len(self._answers) > self._MAX_ANSWERS:
                _, (_, when) = next(iter(self._answers.items()))
                if now - when < self._ANSWER_KEPT_S:
                    break
                self._answers.popitem(last=False)
            self._answered.notify_all()

    def _release_ready(self, store: ClaimStore | None, final: bool) -> None:
        """Deferred releases whose output landed or whose wait ran out (all, if ``final``)."""
        if not self._deferred:
            return
        now = time.monotonic()
        waiting = []
        for name, after, deadline in self._deferred:
            try:
                ready = final or now >= deadline or after()
            except Exception:  # a check that fails: release now
                ready = True
            if ready:
                self._release(store, name)
            else:
                waiting.append((name, after, deadline))
        self._deferred = waiting

    def _release(self, store: ClaimStore | None, name: str) -> None:
        self._held.discard(name)
        with self._lock:  # an answer nobody collected says nothing after this
            self._answers.pop(name, None)
        if store is None:
            return
        try:
            store.release(name)
        except Exception as exc:  # it expires anyway
            logger.debug("Claim store failed (release): %s", exc)

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (releases included), then stop."""
        self._queue.put(None)
        self._thread.join(timeout)


@dataclass(frozen=True)
class _Order:
    action: str  # "claim" or "release"
    names: tuple[str, ...]
    seconds: float  # claim: the TTL; release: the most it waits for ``after``
    after: Callable[[], bool] | None = None
