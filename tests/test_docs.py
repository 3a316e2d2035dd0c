"""The docs match the code: config reference, YAML examples, CLI commands, links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from lmcache_ec.cli import app
from lmcache_ec.cli.reference import render_table, table_in
from lmcache_ec.config import SCHEMA, load_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))


def test_configuration_reference_is_generated_from_the_schema():
    document = (DOCS / "configuration.md").read_text()
    assert table_in(document) == render_table(), "run: lmcache-ec config-doc --write"


def test_every_documented_key_exists_and_every_key_is_documented():
    table = table_in((DOCS / "configuration.md").read_text())
    documented = re.findall(r"^\| `([a-z_0-9]+)` \|", table, flags=re.M)
    assert sorted(documented) == sorted(SCHEMA)


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_yaml_examples_load(page, tmp_path):
    for block in _yaml_blocks(page.read_text()):
        document = yaml.safe_load(block)
        if isinstance(document, dict) and "ec" in document:
            load_config(document)  # raises ConfigError naming a bad key


def test_config_examples_load():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        load_config(str(path))


def _commands() -> set[str]:
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    return names | {g.name for g in app.registered_groups}


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_documented_cli_commands_exist(page):
    known = _commands()
    # Command lines and inline code only; prose says "lmcache-ec stores …".
    used = set(re.findall(r"(?:^|`)lmcache-ec ([a-z][a-z-]+)", page.read_text(), flags=re.M))
    assert used <= known, used - known


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_readme_links_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert "docs/" in readme
    for name in ("quickstart", "configuration", "architecture", "operations"):
        assert (DOCS / f"{name}.md").exists()
