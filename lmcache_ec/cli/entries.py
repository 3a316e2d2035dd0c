"""``ls`` and ``stats``: what the shared tiers hold (``purge``: purge_entries.py).

The disk and remote tiers, and the node tier of this machine (``node_tier``):
every process's entries, whichever process wrote them.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from typing import Annotated, Any

import typer
from rich.markup import escape

from ..purge import inventory
from ..purge.inventory import Entry, Selector
from ..remote_names import redact
from .common import (
    ConfigOption,
    console,
    fail,
    human_age,
    human_bytes,
    load,
    new_table,
    parse_duration,
    short,
)
from .entry_session import (
    AgeOption,
    EntrySession,
    JsonOption,
    ModelOption,
    NamespaceOption,
    TierOption,
    WeightsOption,
    tiers_named,
    with_headers,
)


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
    """List cached entries of the disk, node and remote tiers (from their frame headers)."""
    tiers = tiers_named(tier)
    selector = Selector(namespace, model, parse_duration(older_than), weights)
    session = EntrySession(load(config), tiers)
    try:
        entries = session.select(selector)
        with_headers(entries, session.catalog, "reading headers")
    finally:
        session.close()
    unread = [entry for entry in entries if entry.read_failed]
    if unread:  # the store failed these reads: the listing is not what it holds
        session.problems.append(
            f"{len(unread)} remote headers could not be read ({unread[0].error}); "
            "those entries are shown as unreadable, or left out by --older-than/--weights"
        )
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
    session = EntrySession(load(config), ("node", "disk", "remote"))
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


def _scrape(url: str, session: EntrySession) -> dict[str, Any] | None:
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
