"""Fixtures of the fault suite, and the fault table it prints at the end.

Each case calls ``fault_table(fault, behaviour, recovery)``; the rows are
printed as a Markdown table in pytest's terminal summary and written to
``<pytest basetemp>/fault-table.json``. ``recovery`` is a measured number of
seconds (from the end of the fault to the first successful operation through
the tier), or a word when there is nothing to recover (e.g. ``n/a``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.fs import FullDisk, ReadOnlyDir

_ROWS = pytest.StashKey[list[dict]]()
_OUT = pytest.StashKey[Path]()

Record = Callable[[str, str, "float | str | None"], None]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_ROWS] = []


@pytest.fixture
def fault_table(request: pytest.FixtureRequest, tmp_path_factory) -> Record:
    rows = request.config.stash[_ROWS]
    request.config.stash[_OUT] = tmp_path_factory.getbasetemp() / "fault-table.json"

    def record(fault: str, behaviour: str, recovery: float | str | None = None) -> None:
        if isinstance(recovery, float):
            recovery = f"{recovery:.2f} s"
        rows.append(
            {
                "fault": fault,
                "behaviour": behaviour,
                "recovery": recovery or "n/a",
                "test": request.node.nodeid,
            }
        )

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    rows = config.stash.get(_ROWS, [])
    if not rows:
        return
    path = config.stash[_OUT]
    path.write_text(json.dumps(rows, indent=1))
    terminalreporter.section("fault table")
    terminalreporter.write_line("| fault | behaviour observed | recovery time |")
    terminalreporter.write_line("|---|---|---|")
    for row in rows:
        terminalreporter.write_line(f"| {row['fault']} | {row['behaviour']} | {row['recovery']} |")
    terminalreporter.write_line(f"(written to {path})")


@pytest.fixture(params=["tmpfs", "rlimit"])
def full_disk(request, disk_dir: Path) -> Iterator[FullDisk]:
    """The disk tier's directory on a filesystem the test can fill and free."""
    disk = FullDisk(disk_dir, prefer=request.param)
    try:
        yield disk
    finally:
        disk.close()


@pytest.fixture
def read_only(disk_dir: Path) -> Iterator[ReadOnlyDir]:
    """Call ``protect()`` to make the disk directory read-only (undone at teardown)."""
    guard = ReadOnlyDir(disk_dir)
    try:
        yield guard
    finally:
        guard.release()
