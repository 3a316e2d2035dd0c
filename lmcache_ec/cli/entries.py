"""``ls``, ``purge`` and ``stats``: what the shared tiers hold, and removing it.

The disk and remote tiers, and the node tier of this machine (``node_tier``):
every process's entries, whichever process wrote them.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import Progress

from ..config import ECConfig
from ..purge import inventory
from ..purge.inventory import Entry, Selector
from ..purge.marker import PurgeMarker
from ..remote_names import redact
from .common import (
    ConfigOption,
    console,
    err_console,
    fail,
    human_age,
    human_bytes,
    load,
    new_table,
    parse_duration,
    short,
)

ModelOption = Annotated[
    str | None, typer.Option("--model", "-m", help="Only entries of this model (exact name).")
]
NamespaceOption = Annotated[
    str | None, typer.Option("--namespace", "-n", help="Only entries of this namespace.")
]
TierOption = Annotated[
    str,
    typer.Option("--tier", help="disk, node (this machine's), remote, or all of them."),
]
AgeOption = Annotated[
    str | None,
    typer.Option("--older-than", help="Only entries created at least this long ago (15m, 2h, 7d)."),
]
WeightsOption = Annotated[
    str | None,
    typer.Option(
        "--weights",
        help="Only entries of this encoder weights version (the header's weights field; "
        "'' for entries stored without one).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

PROGRESS_THRESHOLD = 200  # entries; below this the work is instant


def _tiers(tier: str) -> tuple[str, ...]:
    choices = {
        "disk": ("disk",),
        "node": ("node",),
        "remote": ("remote",),
        "all": ("node", "disk", "remote"),
    }
    if tier not in choices:
        fail(f"--tier must be one of {', '.join(choices)}, not {tier!r}", 2)
    return choices[tier]


class _Session:
    """Config plus the remote catalog (if configured). A tier that cannot be
    opened or listed (a remote that fails, a disk or node directory of another
    user) is ``skipped`` with its problem kept: nothing is deleted or recorded
    there, the other tiers are still served."""

    def __init__(self, config: ECConfig, tiers: tuple[str, ...]) -> None:
        self.config = config
        self.tiers = tiers
        self.catalog: Any = None
        self.problems: list[str] = []
        self.skipped: set[str] = set()
        if "remote" in tiers and config.remote.url is not None:
            try:
                self.catalog = inventory.open_remote(config)
            except inventory.RemoteUnavailable as exc:
                self.skipped.add("remote")
                self.problems.append(f"remote tier skipped: {exc}")
        if tiers == ("disk",) and not config.local_disk:
            self.problems.append("no disk tier configured (local_disk is unset)")
        if tiers == ("node",) and not config.node_tier:
            self.problems.append("no node tier configured (node_tier is off)")

    def select(self, selector: Selector) -> list[Entry]:
        """The entries of this session's tiers that ``selector`` selects by name."""
        found: list[Entry] = []
        for tier in self.tiers:  # one at a time: an unreadable one spoils no other
            try:
                found.extend(
                    inventory.select(
                        self.config,
                        selector,
                        tiers=(tier,),
                        catalog=self.catalog,
                    )
                )
            except OSError as exc:
                self.skip(tier, exc)
            except inventory.RemoteUnavailable as exc:  # nothing of it seen: nothing to act on
                self.skipped.add(tier)
                self.problems.append(f"{tier} tier skipped: {exc.__cause__ or exc}")
        return found

    def skip(self, tier: str, exc: OSError) -> None:
        """Leave ``tier`` out: its directory cannot be listed (another user's, not a directory)."""
        if tier in self.skipped:
            return
        self.skipped.add(tier)
        detail = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)
        self.problems.append(f"{tier} tier skipped: its directory cannot be listed ({detail})")

    def usage(self, tier: str, directory: str) -> int:
        """Bytes of writes in progress in ``directory`` of ``tier`` (0 if skipped)."""
        if tier in self.skipped:
            return 0
        try:
            return inventory.directory_usage(directory)["writing_bytes"]
        except OSError as exc:
            self.skip(tier, exc)
            return 0

    def close(self) -> None:
        if self.catalog is not None:
            self.catalog.close()

    def report(self) -> None:
        for problem in self.problems:
            err_console.print(f"[yellow]warning:[/] {escape(problem)}")
        if self.problems:
            raise typer.Exit(1)


def _with_headers(entries: list[Entry], catalog: Any, label: str) -> None:
    if len(entries) < PROGRESS_THRESHOLD:
        inventory.read_headers(entries, catalog)
        return
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task(label, total=len(entries))
        inventory.read_headers(entries, catalog, lambda: progress.advance(task))


def _row(entry: Entry, now: float) -> dict[str, Any]:
    header = entry.header or {}
    return {
        "tier": entry.tier,
        "name": entry.name,
        "namespace": header.get("namespace"),
        "model": header.get("model"),
        "revision": header.get("revision"),
        "weights": header.get("weights"),
        "mm_hash": header.get("mm_hash"),
        "shape": header.get("shape"),
        "dtype": header.get("tensor_dtype"),
        "size": entry.size,
        "created": entry.created,
        "age_seconds": entry.age(now),
        "error": entry.error,
    }


def ls(
    config: ConfigOption = None,
    model: ModelOption = None,
    namespace: NamespaceOption = None,
    tier: TierOption = "all",
    older_than: AgeOption = None,
    weights: WeightsOption = None,
    limit: Annotated[int, typer.Option(min=0, help="Show at most this many entries (0: all).")] = 0,
    as_json: JsonOption = False,
) -> None:
    """List cached entries of the disk and remote tiers (from their frame headers)."""
    tiers = _tiers(tier)
    selector = Selector(namespace, model, parse_duration(older_than), weights)
    session = _Session(load(config), tiers)
    try:
        entries = session.select(selector)
        _with_headers(entries, session.catalog, "reading headers")
    finally:
        session.close()
    now = time.time()
    entries = list(inventory.filter_headers(entries, selector, now))
    shown = entries[:limit] if limit > 0 else entries
    if as_json:
        console.print_json(json.dumps([_row(e, now) for e in shown]))
    else:
        table = new_table(
            f"{len(entries)} entries, {human_bytes(sum(e.size for e in entries))}",
            ("tier", "namespace", "model", "mm_hash", "shape", "dtype", "size", "age"),
            right=("size", "age"),
        )
        # Header fields are whatever a writer stored: escaped, never read as markup.
        for entry in shown:
            row = _row(entry, now)
            if entry.error:
                table.add_row(
                    entry.tier,
                    "[red]unreadable[/]",
                    escape(entry.error),
                    escape(short(entry.name, 24)),
                    "",
                    "",
                    human_bytes(entry.size),
                    human_age(row["age_seconds"]),
                )
                continue
            table.add_row(
                entry.tier,
                escape(short(row["namespace"], 20)),
                escape(short(row["model"], 32)),
                escape(short(row["mm_hash"], 16)),
                escape("x".join(str(d) for d in row["shape"])),
                escape(str(row["dtype"])),
                human_bytes(entry.size),
                human_age(row["age_seconds"]),
            )
        console.print(table)
    session.report()


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
    """Delete entries from the disk and remote tiers by model, namespace, weights, age, or all.

    Running engines sharing a purged tier notice it through a purge marker
    and stop serving the selected entries within their ``purge_check_s``.
    """
    if not (everything or model or namespace or older_than or weights is not None):
        fail("say what to purge: --model, --namespace, --weights, --older-than, or --all", 2)
    tiers = _tiers(tier)
    selector = Selector(namespace, model, parse_duration(older_than), weights)
    try:  # a selection no engine could read from the purge log deletes nothing
        PurgeMarker.new(selector).to_line()
    except ValueError as exc:
        fail(f"cannot purge this selection: {exc}", 2)
    session = _Session(load(config), tiers)
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
            _with_headers(entries, session.catalog, "reading headers")
            entries = list(inventory.filter_headers(entries, selector))
            unknown = _unknown(named, entries)
        if dry_run:
            for entry in entries:
                deleted[entry.tier] += 1
                freed[entry.tier] += entry.size
        else:
            reached = _namespaces_reached(session, selector, named)  # before their entries go
            failed = _delete(session, entries, deleted, freed)
            marked = _mark_purged(session, tiers, selector, reached, rerun)
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
    session: _Session, entries: list[Entry], deleted: Counter[str], freed: Counter[str]
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


def _report_unknown(session: _Session, unknown: Counter[str]) -> None:
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
    session: _Session, selector: Selector, named: list[Entry]
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
    session: _Session,
    tiers: tuple[str, ...],
    selector: Selector,
    reached: dict[str, str | None],
    rerun: Callable[[str, str], str],
) -> list[str]:
    """Append the purge to the purge log of each namespace in ``reached``, on
    each purged tier (``purge/marker.py``); without ``--namespace``, also of
    each namespace with a log on the disk tier (its engines listen there, and a
    purge run again after a failed append finds their entries gone)."""
    from ..purge.marker import append_disk, append_remote, disk_log_slugs
    from ..tiers.disk_layout import DirectoryModes

    config = session.config
    try:
        line = PurgeMarker.new(selector).to_line()
    except ValueError as exc:
        session.problems.append(f"cannot write the purge marker: {exc}")
        return []
    marked = []
    directory = config.local_disk  # resolved by the loader: a plain path
    if "disk" in tiers and directory and "disk" not in session.skipped:
        modes = DirectoryModes.of(config.local_disk_group_shared)
        namespaces = dict(reached)
        try:
            if selector.namespace is None:
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


def stats(
    config: ConfigOption = None,
    metrics_url: Annotated[
        str | None,
        typer.Option(
            "--metrics-url",
            help="Prometheus endpoint of a running engine to read its hit/miss "
            "counters from: vLLM's /metrics (vllm:lmcache_ec_*) or metrics_export's "
            "(lmcache_ec_*).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Entries and bytes per persistent tier; hit/miss counters of a running engine."""
    if metrics_url and "@" in metrics_url.partition("://")[2].partition("/")[0]:
        # urllib sends no credentials from a URL: it could only print them.
        shown = redact(metrics_url)
        fail(f"--metrics-url {shown!r}: credentials in it are not used; leave them out", 2)
    session = _Session(load(config), ("node", "disk", "remote"))
    tiers: dict[str, Any] = {}
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    try:
        entries = session.select(Selector())
    finally:
        session.close()
    config = session.config
    if config.node_tier and "node" not in session.skipped:
        from ..tiers.node import node_dirs, node_root

        tiers["node"] = {
            "entries": 0,
            "bytes": 0,
            "capacity": config.node_bytes,  # per namespace directory
            "location": node_root(config.node_dir) or config.node_dir,
            "writing_bytes": sum(session.usage("node", d) for d in node_dirs(config.node_dir)),
        }
    if config.local_disk and "disk" not in session.skipped:
        tiers["disk"] = {
            "entries": 0,
            "bytes": 0,
            "capacity": config.disk_bytes,
            "location": config.local_disk,
            # Writes in progress, any process's: reserved under the limit too.
            "writing_bytes": session.usage("disk", config.local_disk),
        }
    # Opened only for a remote_url store; one that could not be listed is left
    # out (with its warning), never shown as empty.
    if session.catalog is not None and "remote" not in session.skipped:
        tiers["remote"] = {
            "entries": 0,
            "bytes": 0,
            "capacity": None,
            "location": redact(config.remote.url),  # never its password
        }
    for entry in entries:
        tiers[entry.tier]["entries"] += 1
        tiers[entry.tier]["bytes"] += entry.size
        _, ns, model, _ = entry.name.split(".")
        groups[(entry.tier, ns, model)][0] += 1
        groups[(entry.tier, ns, model)][1] += entry.size
    counters = _scrape(metrics_url, session) if metrics_url else None
    if as_json:
        console.print_json(
            json.dumps(
                {
                    "tiers": tiers,
                    "groups": [
                        {"tier": t, "namespace_slug": n, "model_slug": m, "entries": c, "bytes": b}
                        for (t, n, m), (c, b) in sorted(groups.items())
                    ],
                    "counters": counters,
                }
            )
        )
    else:
        _print_stats(tiers, groups, counters, metrics_url)
    session.report()


def _print_stats(tiers: dict[str, Any], groups: dict, counters: Any, url: str | None) -> None:
    table = new_table(
        "Shared tiers (every process's entries)",
        ("tier", "entries", "bytes", "capacity", "location"),
        right=("entries", "bytes", "capacity"),
    )
    for name, tier in tiers.items():
        capacity = tier["capacity"]
        table.add_row(
            name,
            str(tier["entries"]),
            human_bytes(tier["bytes"]),
            human_bytes(capacity) if capacity else "-",
            escape(str(tier["location"])),
        )
    console.print(table)
    if groups:
        table = new_table(
            "By namespace / model (storage-name slugs)",
            ("tier", "namespace", "model", "entries", "bytes"),
            right=("entries", "bytes"),
        )
        for (tier, ns, model), (count, size) in sorted(groups.items()):
            table.add_row(tier, escape(ns), escape(model), str(count), human_bytes(size))
        console.print(table)
    if counters is None and url:
        return  # the reason is reported as a warning
    if counters is None:
        console.print(
            "[dim]Hit/miss counters live in the serving process: pass --metrics-url "
            "http://HOST:PORT/metrics of an engine exporting them.[/]"
        )
        return
    table = new_table(f"Counters from {escape(str(url))}", ("counter", "value"), right=("value",))
    for name, value in counters.items():  # escape: "hits[disk]" is not markup
        table.add_row(escape(name), f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)


# Metric name prefixes: standalone export (metrics_export) and vLLM's /metrics,
# where the connector's counters are ``vllm:lmcache_ec_*`` (integration/vllm/stats).
METRIC_PREFIXES = ("vllm:lmcache_ec_", "lmcache_ec_")
SCRAPE_DEADLINE_S = 5.0  # the whole answer, headers and body, from connecting on
SCRAPE_MAX_BYTES = 16 << 20  # a metrics page past this is no engine's (vLLM's: < 1 MiB)


def _fetch(url: str) -> bytes:
    """The body at ``url``: whole within SCRAPE_DEADLINE_S, and at most
    SCRAPE_MAX_BYTES, else OSError. ``urlopen``'s timeout bounds each read only,
    so a server trickling its answer would hold it forever: the read runs in a
    daemon thread, left behind at the deadline."""
    from urllib.request import urlopen

    outcome: list[bytes | BaseException] = []

    def read() -> None:
        try:
            with urlopen(url, timeout=SCRAPE_DEADLINE_S) as response:
                outcome.append(response.read(SCRAPE_MAX_BYTES + 1))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    reader = threading.Thread(target=read, name="lmcache-ec-scrape", daemon=True)
    reader.start()
    reader.join(SCRAPE_DEADLINE_S)
    if not outcome:
        raise TimeoutError(f"no whole answer within {SCRAPE_DEADLINE_S:g}s")
    body = outcome[0]
    if isinstance(body, BaseException):
        raise body
    if len(body) > SCRAPE_MAX_BYTES:
        raise OSError(f"the answer is larger than {human_bytes(SCRAPE_MAX_BYTES)}")
    return body


def _scrape(url: str, session: _Session) -> dict[str, Any] | None:
    """Sum lmcache-ec counters over every engine the endpoint reports.

    Reads both the standalone names (``lmcache_ec_hits_total``…) and vLLM's
    (``vllm:lmcache_ec_hits_total``…). A page without any of them, or one
    that is not Prometheus text (an HTML page, a binary body), is a problem
    (exit 1), never a silent ``hit_rate 0``.
    """
    from http.client import HTTPException, InvalidURL

    from prometheus_client.parser import text_string_to_metric_families

    try:
        body = _fetch(url)
    except (ValueError, InvalidURL) as exc:  # not a URL: the user's to fix
        fail(f"invalid --metrics-url {url!r}: {exc}", 2)
    except OSError as exc:
        session.problems.append(f"cannot read metrics from {url}: {exc}")
        return None
    except HTTPException as exc:  # something answered, but not in HTTP
        session.problems.append(
            f"cannot read metrics from {url}: not an HTTP response ({type(exc).__name__}: {exc})"
        )
        return None
    try:
        # The parser is lazy: parse it all here, where its errors are caught.
        families = list(text_string_to_metric_families(body.decode()))
    except ValueError as exc:  # UnicodeDecodeError too
        session.problems.append(
            f"{url} is not a Prometheus metrics page ({short(str(exc), 120)}); "
            "is this the engine's /metrics?"
        )
        return None
    counters: dict[str, Any] = {}
    found = False
    for family in families:
        prefix = next((p for p in METRIC_PREFIXES if family.name.startswith(p)), None)
        if prefix is None:
            continue
        found = True
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            name = sample.name.removeprefix(prefix).removesuffix("_total")
            if "tier" in sample.labels:
                name = f"{name}[{sample.labels['tier']}]"
            value = sample.value
            value = int(value) if float(value).is_integer() else value
            counters[name] = counters.get(name, 0) + value
    if not found:
        session.problems.append(
            f"no lmcache-ec metrics on {url} (looked for "
            f"{' and '.join(p + '*' for p in METRIC_PREFIXES)}); is the connector enabled "
            "in that engine, and is this its /metrics page?"
        )
        return None
    hits = sum(v for k, v in counters.items() if k.startswith("hits["))
    lookups = hits + counters.get("misses", 0)
    counters["hit_rate"] = hits / lookups if lookups else 0.0
    return counters
