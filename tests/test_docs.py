"""The docs match the code: config reference, YAML examples, CLI commands, links, file paths.

Each page is checked for what it holds; a page none of the checks applies to
fails ``test_every_page_is_checked``.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from lmcache_ec.cli import app
from lmcache_ec.cli.reference import render_table, table_in
from lmcache_ec.config import load_config
from lmcache_ec.config_schema import SCHEMA

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _pages_with(find) -> list[Path]:
    """The pages on which ``find`` (text -> list) finds something."""
    return [page for page in PAGES if find(page.read_text())]


def test_configuration_reference_is_generated_from_the_schema():
    document = (DOCS / "configuration.md").read_text()
    assert table_in(document) == render_table(), "run: lmcache-ec config-doc --write"


def test_every_documented_key_exists_and_every_key_is_documented():
    table = table_in((DOCS / "configuration.md").read_text())
    documented = re.findall(r"^\| `([a-z_0-9]+)` \|", table, flags=re.M)
    assert sorted(documented) == sorted(SCHEMA)


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("page", _pages_with(_yaml_blocks), ids=_page_id)
def test_yaml_examples_load(page):
    for block in _yaml_blocks(page.read_text()):
        document = yaml.safe_load(block)  # every block is YAML
        if isinstance(document, dict) and "ec" in document:
            load_config(document)  # raises ConfigError naming a bad key


def test_config_examples_load():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        load_config(str(path))


def _commands() -> set[str]:
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    return names | {g.name for g in app.registered_groups}


def _cli_commands_used(text: str) -> list[str]:
    # Command lines and inline code only; prose says "lmcache-ec stores …".
    return re.findall(r"(?:^|`)lmcache-ec ([a-z][a-z-]+)", text, flags=re.M)


@pytest.mark.parametrize("page", _pages_with(_cli_commands_used), ids=_page_id)
def test_documented_cli_commands_exist(page):
    used = set(_cli_commands_used(page.read_text()))
    assert used <= _commands(), used - _commands()


def _relative_links(text: str) -> list[str]:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    return [target for target in targets if "://" not in target]


@pytest.mark.parametrize("page", _pages_with(_relative_links), ids=_page_id)
def test_relative_links_resolve(page):
    for target in _relative_links(page.read_text()):
        assert (page.parent / target).exists(), f"{_page_id(page)}: broken link {target}"


# A file named in inline code: `storage/manager.py`, `tests/test_*.py`,
# `v1/worker/gpu_worker.py:587` (vLLM's, with a line), `configs/local.yaml`.
FILE_PATH = re.compile(r"`([\w./*-]+\.(?:py|sh|yaml|toml))(?::\d+)?`")


def _file_paths(text: str) -> list[str]:
    return FILE_PATH.findall(text)


@functools.cache
def _known_files() -> tuple[str, ...]:
    """This repository's files, then LMCache's and vLLM's modules (pages cite their lines)."""
    files = [
        path.relative_to(ROOT).as_posix()
        for top in ("lmcache_ec", "tests", "configs", "gpu", "docs")
        for path in (ROOT / top).rglob("*")
        if path.is_file()
    ]
    files += [path.name for path in ROOT.iterdir() if path.is_file()]
    for package in ("lmcache", "vllm"):
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            base = Path(location)
            files += [f"{package}/{p.relative_to(base).as_posix()}" for p in base.rglob("*.py")]
    return tuple(files)


@pytest.mark.parametrize("page", _pages_with(_file_paths), ids=_page_id)
def test_files_named_exist(page):
    """A file a page names exists: its path, or the end of one (``manager.py``
    in a section about ``storage/``); a renamed module shows here."""
    known = _known_files()
    missing = [
        name
        for name in sorted(set(_file_paths(page.read_text())))
        if not any(
            fnmatch.fnmatch(path, name) or fnmatch.fnmatch(path, f"*/{name}") for path in known
        )
    ]
    assert not missing, f"{_page_id(page)} names files that do not exist: {missing}"


def test_every_page_is_checked():
    checks = (_yaml_blocks, _cli_commands_used, _relative_links, _file_paths)
    unchecked = [
        _page_id(page) for page in PAGES if not any(find(page.read_text()) for find in checks)
    ]
    assert not unchecked, f"pages no check applies to: {unchecked}"


def test_every_page_is_reachable_from_the_readme():
    """The README links the docs index, and the index links every page."""
    assert "docs/" in _relative_links((ROOT / "README.md").read_text())
    indexed = set(_relative_links((DOCS / "README.md").read_text()))
    pages = {page.name for page in DOCS.glob("*.md")} - {"README.md"}
    assert pages <= indexed, f"docs/README.md does not link {sorted(pages - indexed)}"


# The calls that name a counter of the vLLM connector, with the prefix the
# scheduler's counters get (``TierScheduler.count``: ``scheduler_<name>``).
_COUNTER_CALLS = re.compile(r'\b(?:_?count|record)\(\s*"([a-z_]+)"|_counters\["([a-z_]+)"\]')


def test_every_counter_of_the_vllm_connector_is_documented():
    """A counter added to the connector is named in docs/vllm.md's list (as is, or
    with the scheduler's ``scheduler_`` prefix)."""
    document = (DOCS / "vllm.md").read_text()
    named = set(re.findall(r"`([a-z_]+)`", document))
    counted = set()
    for source in (ROOT / "lmcache_ec" / "integration" / "vllm").glob("*.py"):
        for match in _COUNTER_CALLS.finditer(source.read_text()):
            counted.add(match.group(1) or match.group(2))
    assert counted, "no counter found: the pattern no longer matches the code"
    missing = sorted(n for n in counted if n not in named and f"scheduler_{n}" not in named)
    assert not missing, f"counters not named in docs/vllm.md: {missing}"
