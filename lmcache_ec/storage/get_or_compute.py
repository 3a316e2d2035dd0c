"""Get or compute: the stored tensor, or the computed one stored, once per entry.

``ECCache.get_or_compute`` and ``get_or_compute_many`` (contract and
guarantees in docs/library.md) run here, on the primitives of
``single_flight.py``: per entry, one caller of the process leads (the others
follow and receive a copy of its result); a leader looks the entry up, and
for what no tier holds claims it in the tier the instances share, computes
what it won in one call, stores it, and withdraws those claims once the output
reached the shared tiers; only then does it wait for what another instance
holds (``ClaimWait``): an instance never holds a claim it is not computing
while it waits for another's, so two instances that each won what the other
waits for never wait on each other. What the wait gives up on is computed in
a second call.

A leader lands each flight as soon as its entry's result is known (a hit at
once, an entry of another instance once loaded): its followers, and its own
``compute`` asking for them, never wait for the rest of its batch. A follower
waits without limit for a ``compute`` running in this process, but for
another instance's output only up to its own ``wait_s``; then it computes the
entry itself (a duplicate computation, never a wrong tensor).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from ..claims import ClaimAgent
from ..config import ECConfig
from ..key import ECKey, EncoderIdentity
from ..metrics import ECStats
from .compute_results import checked_results
from .single_flight import ClaimWait, Flight, LocalFlights, Turn, claim_store_factory

logger = logging.getLogger(__name__)

ComputeMany = Callable[[list[str]], Sequence[torch.Tensor]]
# The stored tensors of keys (the cache's get_many, by key rather than by hash).
ReadKeys = Callable[[list[ECKey], torch.device], list[torch.Tensor | None]]

DEFAULT_WAIT_S = 1.0  # get_or_compute: the most a caller waits for another instance
_FOLLOW_POLL_S = ClaimWait(0.0).max_pause_s  # how often a follower looks at its leader's state


def _detached_copy(tensor: torch.Tensor) -> torch.Tensor:
    """What a follower gets: its own copy, outside the leader's autograd graph
    (``get`` returns detached tensors too)."""
    return tensor.detach().clone()


class Cache(Protocol):
    """What the flow uses of the cache it serves (``ECCache``)."""

    stats: ECStats
    identity: EncoderIdentity

    def key(self, mm_hash: str) -> ECKey: ...

    def writing_below(self, key: ECKey) -> bool: ...

    def put(
        self, mm_hash: str, tensor: torch.Tensor, *, identity: EncoderIdentity | None = None
    ) -> bool: ...


class GetOrCompute:
    """One cache's get-or-compute: its flights in this process and its claims."""

    def __init__(
        self,
        cache: Cache,
        config: ECConfig,
        read: ReadKeys,
        *,
        check_open: Callable[[], None],
        check_fits: Callable[[int], None],
        purge_stamp: Callable[[], int],
    ) -> None:
        self._cache = cache
        self._purge_stamp = purge_stamp  # TierReader.purge_stamp: a removal or purge began?
        self._config = config
        self._read_keys = read
        self._check_open = check_open  # raises once the cache is closed
        self._check_fits = check_fits  # a frame of this size fits the CPU tier, or ValueError
        self._flights = LocalFlights()
        # The flights whose leader waits for another instance's output (not computing).
        self._on_others: set[Flight] = set()
        self._on_others_lock = threading.Lock()
        self._claims_lock = threading.Lock()
        self._claims: ClaimAgent | None = None  # made on the first get_or_compute
        self._no_claims = claim_store_factory(config) is None  # no tier to share one in
        self._claim_answer_s = config.remote.timeout

    def run(
        self, mm_hashes: Sequence[str], compute: ComputeMany, target: torch.device, wait_s: float
    ) -> list[torch.Tensor]:
        """``ECCache.get_or_compute_many`` (its documented contract), ``wait_s``
        checked by the caller."""
        wanted = list(dict.fromkeys(mm_hashes))
        # This call reads, claims and checks under this identity, and stores what it
        # computes only if it is still the cache's at the store (_compute_and_store).
        identity = self._cache.identity
        # Every name before any flight is joined: a bad hash fails the call
        # without leaving a flight (and its followers) behind.
        names = {mm_hash: self._name(mm_hash, identity) for mm_hash in wanted}
        found: dict[str, torch.Tensor] = {}
        while len(found) < len(wanted):
            # The most this round waits for another instance's output, through a
            # leader of this process too.
            deadline = time.monotonic() + wait_s
            leading: dict[str, tuple[str, Flight]] = {}
            following: dict[str, Flight] = {}
            own: list[str] = []  # the outer call of this thread waits for them from another
            try:
                self._join(wanted, names, found, leading, following, own)
            except BaseException:  # a caught Ctrl-C too: no flight of ours left unlanded
                self._abandon(leading)
                raise
            if leading:
                found.update(self._lead(leading, compute, target, float(wait_s), identity))
            late = self._read_until(own, deadline, identity, target, found)
            for mm_hash, flight in following.items():
                if not self._landed_by(flight, deadline):
                    late.append(mm_hash)
                elif flight.result is not None:  # else its leader failed: ask again
                    found[mm_hash] = flight.result.to(target, copy=True)
            if late:  # waited out: computed here too, without claims (the leader's)
                self._compute_and_store(
                    late, names, compute, target, float(wait_s), identity, found, claimed=False
                )
        # A hash asked twice gets two tensors, as from get_many.
        answers, seen = [], set()
        for mm_hash in mm_hashes:
            answers.append(found[mm_hash].clone() if mm_hash in seen else found[mm_hash])
            seen.add(mm_hash)
        return answers

    def _join(
        self,
        wanted: list[str],
        names: dict[str, str],
        found: dict[str, torch.Tensor],
        leading: dict[str, tuple[str, Flight]],
        following: dict[str, Flight],
        own: list[str],
    ) -> None:
        """Join the flight of each hash not ``found`` yet: as its leader, a
        follower, or (``own``) the thread whose outer call leads it."""
        for mm_hash in wanted:
            if mm_hash in found:
                continue
            name = names[mm_hash]
            flight, leads = self._flights.join(name)
            if leads:
                leading[mm_hash] = (name, flight)
            elif flight.leader != threading.get_ident():
                following[mm_hash] = flight
            elif self._waits_on_another(flight):
                own.append(mm_hash)  # its flight cannot land while this thread is here
            else:  # asked from inside this thread's own compute of that entry
                raise RuntimeError(
                    f"compute for {mm_hash!r:.80} asked get_or_compute for the same key: "
                    "it would wait for itself"
                )

    def _key(self, mm_hash: str, identity: EncoderIdentity) -> ECKey:
        """The key of ``mm_hash`` under ``identity`` (the call's)."""
        key = self._cache.key(mm_hash)  # memoised: a hit costs no SHA-256
        if key.identity is not identity:  # set_identity since the call began
            key = identity.key(mm_hash)
        return key

    def _name(self, mm_hash: str, identity: EncoderIdentity) -> str:
        """The storage name of ``mm_hash`` under ``identity`` (the call's)."""
        return self._key(mm_hash, identity).storage_name

    def _read(
        self, hashes: list[str], identity: EncoderIdentity, device: torch.device
    ) -> list[torch.Tensor | None]:
        """The stored tensors of ``hashes`` under the call's ``identity``, whatever
        the cache's is now: another identity's output is never this call's."""
        return self._read_keys([self._key(h, identity) for h in hashes], device)

    def _abandon(self, leading: dict[str, tuple[str, Flight]]) -> None:
        """Land the flights joined as leader without a result: their followers ask again."""
        for name, flight in leading.values():
            self._flights.land(name, flight, None)

    def _waits_on_another(self, flight: Flight) -> bool:
        """Whether the leader of ``flight`` waits for another instance's output."""
        with self._on_others_lock:
            return flight in self._on_others

    def _mark_on_others(
        self, flights: dict[str, tuple[str, Flight]], hashes: list[str], waits: bool
    ) -> None:
        """Say whether the leader of these flights waits for another instance
        (True) or computes them (False)."""
        with self._on_others_lock:
            for mm_hash in hashes:
                if waits:
                    self._on_others.add(flights[mm_hash][1])
                else:
                    self._on_others.discard(flights[mm_hash][1])

    def _land(
        self,
        flights: dict[str, tuple[str, Flight]],
        hashes: list[str],
        results: dict[str, torch.Tensor],
    ) -> None:
        """Land the flights of ``hashes`` (taken out of ``flights``) with their
        results, None for those without one; land never raises."""
        self._mark_on_others(flights, hashes, False)
        try:
            for mm_hash in hashes:
                name, flight = flights[mm_hash]
                self._flights.land(name, flight, results.get(mm_hash), share=_detached_copy)
                del flights[mm_hash]
        except BaseException:  # interrupted part way: the rest land without a result
            self._abandon({h: flights.pop(h) for h in hashes if h in flights})
            raise

    def _landed_by(self, flight: Flight, deadline: float) -> bool:
        """Wait for ``flight`` to land: without limit while its leader computes,
        until ``deadline`` while it waits for another instance. Whether it landed."""
        while not flight.done.wait(_FOLLOW_POLL_S):
            if self._waits_on_another(flight) and time.monotonic() >= deadline:
                return False
        return True

    def _read_until(
        self,
        hashes: list[str],
        deadline: float,
        identity: EncoderIdentity,
        device: torch.device,
        found: dict[str, torch.Tensor],
    ) -> list[str]:
        """Look for ``hashes`` in the tiers after growing pauses until
        ``deadline``, moving those that land into ``found``; those that did not."""
        rule = ClaimWait(0.0)  # its pauses only
        waiting, looks = list(hashes), 0
        while waiting:
            landed = self._read(waiting, identity, device)
            found.update((h, t) for h, t in zip(waiting, landed, strict=True) if t is not None)
            waiting = [h for h in waiting if h not in found]
            now = time.monotonic()
            if not waiting or now >= deadline:
                break
            time.sleep(rule.pause(looks, now, deadline))
            looks += 1
        return waiting

    def _lead(
        self,
        leading: dict[str, tuple[str, Flight]],
        compute: ComputeMany,
        device: torch.device,
        wait_s: float,
        identity: EncoderIdentity,
    ) -> dict[str, torch.Tensor]:
        """Get or compute the entries this caller leads; their followers get the
        results, each as soon as it is known (a ``compute`` asking for a hit of
        its own batch finds it landed)."""
        results: dict[str, torch.Tensor] = {}
        flights = dict(leading)  # those not landed yet
        try:
            hashes = list(leading)
            for mm_hash, tensor in zip(hashes, self._read(hashes, identity, device), strict=True):
                if tensor is not None:
                    results[mm_hash] = tensor
            self._land(flights, [h for h in hashes if h in results], results)
            missing = {h: leading[h][0] for h in hashes if h not in results}
            if missing:
                self._claim_and_compute(
                    missing, compute, device, wait_s, identity, results, flights
                )
        finally:
            self._land(flights, list(flights), results)
        return results

    def _claim_and_compute(
        self,
        names: dict[str, str],
        compute: ComputeMany,
        device: torch.device,
        wait_s: float,
        identity: EncoderIdentity,
        results: dict[str, torch.Tensor],
        flights: dict[str, tuple[str, Flight]],
    ) -> None:
        """Entries no tier held: claim them; compute and store those won, then
        wait for those others hold (the ``ClaimWait`` rule) and compute those
        the wait gives up on; fill ``results``, landing each of ``flights`` once
        its result is known."""
        agent = self._claim_agent()
        rule = ClaimWait(wait_s)
        ttl = max(wait_s, 0.001)
        # The wait ends wait_s after the claims, the compute of what was won included:
        # another's claim, made before ours, lasts wait_s from its making too.
        deadline = time.monotonic() + wait_s
        if agent is None:
            answers: list[bool | None] = [True] * len(names)
        else:
            agent.ask_many(list(names.values()), ttl)
            # A claim is one call to the store: it may take the store's timeout
            # (the first also opens the store), however short the wait.
            agent.wait_answers(list(names.values()), max(wait_s, self._claim_answer_s))
            answers = agent.ask_many(list(names.values()), ttl)
        won: list[str] = []
        waiting: list[str] = []
        for mm_hash, answer in zip(names, answers, strict=True):
            # Unanswered within the bound: the store is too slow to wait on.
            if answer is None or rule.after_claim(answer) is Turn.COMPUTE:
                won.append(mm_hash)
            else:
                waiting.append(mm_hash)
        self._cache.stats.add("compute_waits", len(waiting))
        self._mark_on_others(flights, waiting, True)
        if won and agent is not None and agent.shared:
            # Stored by a holder that released its claim between our lookup and our claim.
            self._take_landed(won, names, identity, device, agent, results)
            self._land(flights, [h for h in names if h in results], results)
        # What this caller won is computed, stored and its claims withdrawn before
        # it waits: an instance waiting for it may hold what this one waits for.
        if won:
            try:
                self._compute_and_store(won, names, compute, device, wait_s, identity, results)
            except BaseException:
                for mm_hash in waiting:  # a claim asked for them may yet be answered ours
                    if agent is not None:
                        agent.release(names[mm_hash])
                raise
            self._land(flights, won, results)  # its followers need not wait for the others
        late = self._wait_for_others(
            waiting, names, identity, device, rule, deadline, results, flights
        )
        # A claim asked while waiting for an entry that was then loaded may still
        # be answered ours: withdrawn. (The claims of ``won`` are withdrawn by
        # their compute, those of ``late`` by theirs.)
        if agent is not None:
            for mm_hash in waiting:
                if mm_hash not in late:
                    agent.release(names[mm_hash])
        if late:
            self._compute_and_store(late, names, compute, device, wait_s, identity, results)

    def _wait_for_others(
        self,
        hashes: list[str],
        names: dict[str, str],
        identity: EncoderIdentity,
        device: torch.device,
        rule: ClaimWait,
        deadline: float,
        results: dict[str, torch.Tensor],
        flights: dict[str, tuple[str, Flight]],
    ) -> list[str]:
        """Wait for the outputs of ``hashes``, which other instances hold (the
        ``ClaimWait`` rule), moving those that land into ``results`` and
        landing their ``flights``; the hashes the wait gave up on, for this
        caller to compute.

        One change to the rule: an entry whose claim is still held when its
        deadline passes has most likely changed hands — the first holder's
        claim, made before this caller's, lasted ``bound_s`` and has ended; a
        waiter took it over (that holder died, or its compute failed) and
        computes. Its wait is extended once, by ``bound_s``, so the waiters
        load that one's output instead of all computing (at most twice the
        bound in all).
        """
        agent = self._claims
        ttl = max(rule.bound_s, 0.001)
        deadlines = dict.fromkeys(hashes, deadline)
        held: set[str] = set()  # the last answer to a claim asked again here was "another's"
        extended: set[str] = set()
        waiting, late = list(hashes), []
        looks = 0
        while waiting:
            soonest = min(deadlines[h] for h in waiting)
            time.sleep(rule.pause(looks, time.monotonic(), soonest))
            looks += 1
            frees = agent.ask_many([names[h] for h in waiting], ttl) if agent else []
            landed = self._read(waiting, identity, device)
            now = time.monotonic()
            still: list[str] = []
            for mm_hash, free, tensor in zip(waiting, frees, landed, strict=True):
                if free is False:
                    held.add(mm_hash)
                elif free:
                    held.discard(mm_hash)
                turn = rule.turn(now, deadlines[mm_hash], free, lambda t=tensor: t is not None)
                if turn is Turn.COMPUTE and mm_hash in held and mm_hash not in extended:
                    extended.add(mm_hash)  # once: a wait stays bounded
                    deadlines[mm_hash] = now + rule.bound_s
                    turn = Turn.WAIT
                if turn is Turn.LOAD:
                    results[mm_hash] = tensor
                    self._land(flights, [mm_hash], results)
                    self._cache.stats.add("compute_waits_loaded")
                elif turn is Turn.COMPUTE:
                    late.append(mm_hash)
                    self._mark_on_others(flights, [mm_hash], False)  # computed here now
                else:
                    still.append(mm_hash)
            waiting = still
        return late

    def _take_landed(
        self,
        hashes: list[str],
        names: dict[str, str],
        identity: EncoderIdentity,
        device: torch.device,
        agent: ClaimAgent,
        results: dict[str, torch.Tensor],
    ) -> None:
        """Move the entries of ``hashes`` that a tier now holds into ``results``."""
        landed = self._read(hashes, identity, device)
        for mm_hash, tensor in zip(list(hashes), landed, strict=True):
            if tensor is not None:
                results[mm_hash] = tensor
                hashes.remove(mm_hash)
                agent.release(names[mm_hash])

    def _compute_and_store(
        self,
        hashes: list[str],
        names: dict[str, str],
        compute: ComputeMany,
        device: torch.device,
        wait_s: float,
        identity: EncoderIdentity,
        results: dict[str, torch.Tensor],
        *,
        claimed: bool = True,
    ) -> None:
        """Compute ``hashes``, store them under ``identity``, withdraw their
        claims (``claimed``: else the claims are another caller's of this process).

        ``set_identity`` during the call (new encoder weights): which weights
        computed the results is unknown, so they are returned, never stored.
        """
        agent = self._claims if claimed else None
        stamp = self._purge_stamp()
        try:
            tensors = self._checked(hashes, compute(list(hashes)), identity)
        except BaseException:
            if agent is not None:
                for mm_hash in hashes:
                    agent.release(names[mm_hash])
            raise
        self._cache.stats.add("computes", len(hashes))
        changed = self._cache.identity is not identity
        # A remove() or purge while they were computed may have been meant for
        # them: stored after it, they would be served.
        purged = stamp == -1 or self._purge_stamp() != stamp
        unstorable = changed or purged
        if unstorable:
            self._cache.stats.add("compute_not_stored", len(hashes))
            logger.warning(
                "get_or_compute: %d result(s) not stored: %s while they were computed",
                len(hashes),
                "the cache's identity changed" if changed else "a removal or purge ran",
            )
        unstored: list[str] = []
        for mm_hash, tensor in zip(hashes, tensors, strict=True):
            try:
                stored = not unstorable and self._cache.put(mm_hash, tensor, identity=identity)
            except Exception as exc:  # closed meanwhile: the caller still gets its tensor
                unstored.append(f"{mm_hash:.40}: {exc}")
                stored = False
            if agent is not None:
                key = identity.key(mm_hash)
                # Withdrawn once the output reached the shared tiers: whoever
                # claims it next finds it there instead of computing it again.
                agent.release(
                    names[mm_hash],
                    after=(lambda k=key: not self._cache.writing_below(k)) if stored else None,
                    within_s=wait_s,
                )
            results[mm_hash] = tensor if tensor.device == device else tensor.to(device)
        if unstored:  # one line for the call, however many entries
            logger.warning("get_or_compute: %d not stored (%s)", len(unstored), unstored[0])

    def _checked(
        self, hashes: list[str], tensors: Any, identity: EncoderIdentity
    ) -> list[torch.Tensor]:
        """``compute``'s results, every one storable under the call's ``identity``
        (not the cache's current one), or a clear error (nothing stored)."""
        try:
            return checked_results(hashes, tensors, identity, self._check_fits)
        except (TypeError, ValueError) as exc:
            self._cache.stats.add("compute_rejected")
            logger.warning("get_or_compute: result refused, nothing stored: %s", exc)
            raise

    def _claim_agent(self) -> ClaimAgent | None:
        """This cache's claims (made on first use); None without a tier to share them in."""
        if self._no_claims:
            return None
        with self._claims_lock:
            if self._claims is None:
                self._check_open()
                self._claims = ClaimAgent(claim_store_factory(self._config), DEFAULT_WAIT_S)
            return self._claims

    def take_claims(self) -> ClaimAgent | None:
        """The claims made so far, for the cache's close to withdraw (after its flush)."""
        with self._claims_lock:
            return self._claims
