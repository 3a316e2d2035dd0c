"""``config-doc``: the configuration reference table, generated from ``config_schema.SCHEMA``.

``docs/configuration.md`` holds the table between two markers; ``--write``
regenerates it there, ``--check`` exits 1 when the file has drifted from the
code (``tests/test_docs.py`` runs the same comparison).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..config import ENV_PREFIX
from ..config_schema import SCHEMA, Option
from .common import console, fail, write_text

BEGIN = "<!-- BEGIN CONFIG TABLE (generated: lmcache-ec config-doc --write) -->"
END = "<!-- END CONFIG TABLE -->"
DEFAULT_DOC = Path("docs/configuration.md")


def _default(opt: Option) -> str:
    if opt.default is None:
        return "unset"
    if isinstance(opt.default, bool):
        return "`true`" if opt.default else "`false`"
    return f"`{opt.default}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table() -> str:
    """The Markdown table of every ``ec:`` option, in schema order."""
    lines = [
        "| key | type | default | env override | passed to LMCache | description |",
        "|---|---|---|---|---|---|",
    ]
    for name, opt in SCHEMA.items():
        lines.append(
            f"| `{name}` | {opt.kind} | {_default(opt)} | `{ENV_PREFIX}{name.upper()}` | "
            f"{'yes' if opt.lmcache else 'no'} | {_cell(opt.help)} |"
        )
    return "\n".join(lines)


def table_in(document: str) -> str | None:
    """The table currently between the markers of ``document``."""
    if BEGIN not in document or END not in document:
        return None
    return document.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def with_table(document: str) -> str:
    if table_in(document) is None:
        raise ValueError(f"markers not found: {BEGIN} … {END}")
    head, rest = document.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{BEGIN}\n{render_table()}\n{END}{tail}"


def config_doc(
    path: Annotated[Path, typer.Option(help="The configuration reference file.")] = DEFAULT_DOC,
    write: Annotated[bool, typer.Option("--write", help="Regenerate the table in PATH.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 if PATH is out of date.")] = False,
) -> None:
    """Print (or write, or check) the configuration reference table."""
    if not write and not check:
        console.print(render_table(), markup=False, highlight=False, soft_wrap=True)
        return
    try:
        document = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8
        fail(f"cannot read {path}: {exc}", 2)
    if table_in(document) is None:
        fail(f"{path} has no generated-table markers", 2)
    if check:
        if table_in(document) != render_table():
            fail(f"{path} is out of date with the code: run lmcache-ec config-doc --write")
        console.print(f"{escape(str(path))} matches the code")
        return
    write_text(path, with_table(document))
