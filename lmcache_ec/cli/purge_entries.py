"""``purge``: delete the selected entries from the shared tiers, and tell the
running engines through the purge log (``purge/marker.py``)."""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections import Counter
from collections.abc import Callable
from typing import Annotated

import typer
from rich.progress import Progress

from ..purge import inventory
from ..purge.inventory import Entry, Selector
from ..purge.marker import PurgeMarker
from .common import ConfigOption, console, err_console, fail, human_bytes, load, parse_duration
from .entry_session import (
    AgeOption,
    EntrySession,
    ModelOption,
    NamespaceOption,
    TierOption,
    WeightsOption,
    tiers_named,
    with_headers,
)


def purge(
    config: ConfigOption = None,
    model: ModelOption = None,
    namespace: NamespaceOption = None,
    tier: TierOption = "all",
    older_than: AgeOption = None,
    weights: WeightsOption = None,
    everything: Annotated[
        bool, typer.Option("--all", help="Select every lmcache-ec entry of the tiers.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be deleted; delete nothing.")
    ] = False,
) -> None:
    """Delete entries of the disk, node and remote tiers by model, namespace, weights, age or all.

    Running engines sharing a purged tier notice it through a purge marker
    and stop serving the selected entries within their purge_check_s.
    """
    if not (everything or model or namespace or older_than or weights is not None):
        fail("say what to purge: --model, --namespace, --weights, --older-than, or --all", 2)
    tiers = tiers_named(tier)
    selector = Selector(namespace, model, parse_duration(older_than), weights)
    marker = PurgeMarker.new(selector)
    try:  # a selection no engine could read from the purge log deletes nothing
        marker.to_line()
    except ValueError as exc:
        fail(f"cannot purge this selection: {exc}", 2)
    session = EntrySession(load(config), tiers)
    deleted: Counter[str] = Counter()
    freed: Counter[str] = Counter()
    marked: list[str] = []
    failed: set[str] = set()  # tiers where a deletion failed: entries left there, served
    unknown: Counter[str] = Counter()  # per tier: entries whose header the store failed to give

    def rerun(namespace: str, tier: str) -> str:
        return _purge_command(config, model, namespace, tier, older_than, weights)

    try:
        entries = session.select(selector)
        named = entries  # selected by name: whose namespaces the purge reaches
        if selector.needs_headers:
            with_headers(entries, session.catalog, "reading headers")
            entries = list(inventory.filter_headers(entries, selector))
            unknown = _unknown(named, entries)
        if dry_run:
            for entry in entries:
                deleted[entry.tier] += 1
                freed[entry.tier] += entry.size
        else:
            reached = _namespaces_reached(session, selector, named)  # before their entries go
            # Recorded before the deletes: a purge killed midway has told every
            # namespace it reached (run again, it finds their entries gone, not them).
            told = _mark_purged(session, tiers, marker, reached, rerun)
            failed = _delete(session, entries, deleted, freed)
            # Again after, same generation, later time: a read in between may have
            # cached an entry; engines apply it again and count one purge.
            after = dataclasses.replace(marker, time=time.time())
            marked = _mark_purged(session, tuple(told), after, reached, rerun)
            if "remote" in marked and "remote" not in failed:
                _check_replicas(session)
    finally:
        session.close()
    verb = "would delete" if dry_run else "deleted"
    for name in sorted(set(deleted) | set(tiers)):
        if (
            name in deleted
            or unknown[name]
            or (name == "disk" and session.config.local_disk and name not in session.skipped)
        ):
            left = f"; {unknown[name]} not decided (header unread)" if unknown[name] else ""
            console.print(
                f"{name}: {verb} {deleted[name]} entries ({human_bytes(freed[name])}){left}"
            )
    _report_unknown(session, unknown)
    if not dry_run and marked and not failed:  # entries left in place are still served
        interval = session.config.purge_check_s
        console.print(
            f"[dim]Purge recorded in the purge log on {' and '.join(marked)}: running "
            f"engines sharing it stop serving the purged entries within purge_check_s "
            f"({interval:g}s).[/]"
        )
    session.report()


def _delete(
    session: EntrySession, entries: list[Entry], deleted: Counter[str], freed: Counter[str]
) -> set[str]:
    """Delete ``entries``, counting what was there; the tiers where a deletion
    failed, each with one warning. A remote store that failed once is not asked
    again: a refusal (no delete permission, a read-only replica) or a timeout
    would fail every entry alike, each after up to ``remote_timeout``."""
    first: dict[str, str] = {}  # tier -> its first failure
    left: Counter[str] = Counter()
    with Progress(console=err_console, transient=True, disable=len(entries) < 50) as bar:
        task = bar.add_task("deleting", total=len(entries))
        for entry in entries:
            bar.advance(task)
            if entry.tier == "remote" and "remote" in first:
                left[entry.tier] += 1
                continue
            try:
                if inventory.delete(entry, session.catalog):
                    deleted[entry.tier] += 1
                    freed[entry.tier] += entry.size
            except Exception as exc:
                first.setdefault(entry.tier, f"{entry.name}: {type(exc).__name__}: {exc}")
                left[entry.tier] += 1
    for tier, failure in first.items():
        session.problems.append(
            f"{tier}: cannot delete {failure}; {left[tier]} selected entries left in place "
            f"there, still served: run the purge again once the {tier} tier allows it"
        )
    return set(first)


def _check_replicas(session: EntrySession) -> None:
    """A warning unless every replica of the remote store holds the deletes: a
    failover to one that does not would serve the purged entries again."""
    try:
        replication = session.catalog.replicate()
    except Exception as exc:
        session.problems.append(
            f"remote: cannot tell whether the replicas hold the purge ({type(exc).__name__}: "
            f"{exc}); a failover before they do serves the purged entries again"
        )
        return
    if replication is not None and replication.acked < replication.replicas:
        session.problems.append(
            f"remote: {replication.acked} of {replication.replicas} replicas confirmed the "
            f"purge within {session.catalog.timeout / 2:g}s; a failover to another before it "
            f"catches up serves the purged entries again: check replication, then run the "
            f"purge again"
        )


def _purge_command(
    config: str | None,
    model: str | None,
    namespace: str,
    tier: str,
    older_than: str | None,
    weights: str | None,
) -> str:
    """The ``lmcache-ec purge`` command line of this selection in ``namespace`` and ``tier``."""
    args = ["lmcache-ec", "purge"]
    for option, value in (("--config", config), ("--model", model), ("--namespace", namespace)):
        if value is not None:
            args += [option, value]
    args += ["--tier", tier]
    if older_than is not None:
        args += ["--older-than", older_than]
    if weights is not None:
        args += ["--weights", weights]
    return shlex.join(args)


def _unknown(named: list[Entry], selected: list[Entry]) -> Counter[str]:
    """Per tier, the entries left out because the store failed to give their
    header (a timeout): whether the purge selects them is unknown."""
    taken = {id(entry) for entry in selected}
    return Counter(e.tier for e in named if e.read_failed and id(e) not in taken)


def _report_unknown(session: EntrySession, unknown: Counter[str]) -> None:
    """One warning for every entry left undecided (exit 1): the purge is incomplete."""
    if not unknown:
        return
    counts = ", ".join(f"{tier}: {count}" for tier, count in sorted(unknown.items()))
    session.problems.append(
        f"purge incomplete: the headers of {sum(unknown.values())} entries could not be "
        f"read ({counts}; the store failed, twice each), so whether the selection takes "
        f"them is unknown; they were left in place: run the purge again"
    )


def _namespaces_reached(
    session: EntrySession, selector: Selector, named: list[Entry]
) -> dict[str, str | None]:
    """Slug -> name of each namespace the purge reaches: ``--namespace``, or
    else the config's own and each that ``named`` has entries of. A name is
    read from the header of one entry of its namespace (None if unreadable),
    before the purge deletes them: a warning then names what is left untold."""
    from ..key import slug

    if selector.namespace is not None:
        return {slug(selector.namespace): selector.namespace}
    reached: dict[str, str | None] = {slug(session.config.namespace): session.config.namespace}
    for entry in named:
        namespace_slug = entry.name.split(".")[1]
        if namespace_slug in reached:
            continue
        if entry.header is None and entry.error is None:  # one header read per namespace
            inventory.read_headers([entry], session.catalog)
        name = (entry.header or {}).get("namespace")
        reached[namespace_slug] = name if name and slug(name) == namespace_slug else None
    return reached


def _mark_purged(
    session: EntrySession,
    tiers: tuple[str, ...],
    marker: PurgeMarker,
    reached: dict[str, str | None],
    rerun: Callable[[str, str], str],
) -> list[str]:
    """Append ``marker`` to the purge log of each namespace in ``reached``, on
    each purged tier (``purge/marker.py``); without ``--namespace``, also of
    each namespace with a log on the disk tier (its engines listen there, and a
    purge run again after a failed append finds their entries gone)."""
    from ..purge.marker import append_disk, append_remote, disk_log_slugs
    from ..tiers.disk_layout import DirectoryModes

    config = session.config
    line = marker.to_line()  # checked before anything was deleted
    marked = []
    directory = config.local_disk  # resolved by the loader: a plain path
    if "disk" in tiers and directory and "disk" not in session.skipped:
        modes = DirectoryModes.of(config.local_disk_group_shared)
        namespaces = dict(reached)
        try:
            if marker.namespace is None:
                namespaces = {name: None for name in disk_log_slugs(directory)} | namespaces
        except OSError as exc:  # the namespaces with entries are still told
            session.problems.append(f"disk: cannot list the purge logs: {exc}")
        untold, exc = _append_each(lambda ns: append_disk(directory, ns, line, modes), namespaces)
        if exc is None:
            marked.append("disk")
        elif not isinstance(exc, FileNotFoundError):  # no directory: nobody to tell
            session.problems.append(
                f"disk: cannot write the purge marker: {exc}; {_untold(untold, 'disk', rerun)}"
            )
    if "remote" in tiers and session.catalog is not None and "remote" not in session.skipped:
        untold, exc = _append_each(lambda ns: append_remote(session.catalog, ns, line), reached)
        if exc is None:
            marked.append("remote")
        else:
            session.problems.append(
                f"remote: cannot write the purge marker (running engines keep serving "
                f"their cached copies): {exc}; {_untold(untold, 'remote', rerun)}"
            )
    return marked


def _append_each(
    append: Callable[[str], None], namespaces: dict[str, str | None]
) -> tuple[dict[str, str | None], Exception | None]:
    """``append`` to each namespace's log (by slug), stopping at the first
    failure (a store that fails one fails the rest alike, each after its
    timeout); the namespaces left untold and that failure."""
    order = sorted(namespaces)
    for done, namespace_slug in enumerate(order):
        try:
            append(namespace_slug)
        except Exception as exc:
            return {s: namespaces[s] for s in order[done:]}, exc
    return {}, None


def _untold(untold: dict[str, str | None], tier: str, rerun: Callable[[str, str], str]) -> str:
    """Which namespaces' engines were not told on ``tier``, and the command that tells each."""
    names = [name or f"{s} (a slug: no readable header named it)" for s, name in untold.items()]
    said = f"engines of the namespaces {', '.join(names)} were not told"
    commands = [rerun(name, tier) for name in untold.values() if name is not None]
    if commands:
        said += "; once the tier answers, run " + " and ".join(commands)
    return said
