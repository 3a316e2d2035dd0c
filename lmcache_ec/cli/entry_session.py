"""What ``ls``, ``purge`` and ``stats`` share: their options and a session over the tiers.

A session holds the config and the remote catalog; a tier it cannot open or
list is skipped with its problem kept, and the others are still served.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import Progress

from ..config import ECConfig
from ..purge import inventory
from ..purge.inventory import Entry, Selector
from .common import err_console, fail

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


def tiers_named(tier: str) -> tuple[str, ...]:
    choices = {
        "disk": ("disk",),
        "node": ("node",),
        "remote": ("remote",),
        "all": ("node", "disk", "remote"),
    }
    if tier not in choices:
        fail(f"--tier must be one of {', '.join(choices)}, not {tier!r}", 2)
    return choices[tier]


class EntrySession:
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


def with_headers(entries: list[Entry], catalog: Any, label: str) -> None:
    if len(entries) < PROGRESS_THRESHOLD:
        inventory.read_headers(entries, catalog)
        return
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task(label, total=len(entries))
        inventory.read_headers(entries, catalog, lambda: progress.advance(task))
