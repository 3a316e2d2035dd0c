"""Imports point one way: no module of lmcache_ec imports a module of a higher layer.

The layers, lowest first, are those of docs/architecture.md ("Layers"). A
module may import its own layer and the layers below it. Imports inside
functions count as much as those at the top of a file; only imports under
``if TYPE_CHECKING:`` (annotations, never executed) are exempt. A new module
must be placed in a layer here, or this test fails naming it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "lmcache_ec"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# Lowest first. "x.*" is x and everything under it; an exact name wins over a pattern.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundation",
        (
            "key",
            "codec",
            "claims",
            "config",
            "metrics",
            "metrics_export",
            "runtime_dirs",
            "remote.naming",
            "remote.registry",
            "remote.settings",
            "remote.health",
        ),
    ),
    (
        "tiers",
        (
            "tiers.contract",
            "tiers.writer",
            "tiers.allocator",
            "tiers.local_cpu",
            "tiers.disk_layout",
            "tiers.budget",
            "tiers.frame_directory",
            "tiers.local_disk",
            "tiers.node",
        ),
    ),
    ("remote", ("remote", "remote.*")),
    ("storage", ("tiers", "tiers.manager")),
    ("selection", ("selection", "purge_marker")),
    ("read path", ("promotion", "read_pool", "reads", "replay", "purge_follow", "single_flight")),
    ("engine", ("engine",)),
    ("inventory", ("inventory",)),
    ("integration", ("integration.*",)),
    ("entry points", ("", "cli.*", "bench.*", "demo")),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """The index in LAYERS of a module named relative to the package ("" for it)."""
    for index, (_, names) in enumerate(LAYERS):
        if module in names:
            return index
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if not name.endswith(".*"):
                continue
            prefix = name[:-2]
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), index)
    return None if best is None else best[1]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _resolve(base: str, name: str) -> str:
    """``from base import name``: the module ``base.name`` if there is one, else ``base``."""
    candidate = f"{base}.{name}" if base else name
    return candidate if candidate in MODULES else base


def imports_of(module: str) -> list[tuple[int, str]]:
    """(line, imported lmcache_ec module relative to the package) of ``module``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    found.append((node.lineno, alias.name[len(PACKAGE) + 1 :]))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            elif node.module and (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
                base = node.module[len(PACKAGE) + 1 :]
            else:
                continue
            for alias in node.names:
                found.append((node.lineno, _resolve(base, alias.name)))
    return found


def test_every_module_has_a_layer():
    unplaced = [name or PACKAGE for name in MODULES if layer_of(name) is None]
    assert not unplaced, f"modules in no layer (add them to LAYERS in {__file__}): {unplaced}"


def test_no_module_imports_a_higher_layer():
    violations = []
    for module, path in MODULES.items():
        own = layer_of(module)
        if own is None:
            continue
        for line, imported in imports_of(module):
            target = layer_of(imported)
            if target is not None and target > own:
                violations.append(
                    f"{path.relative_to(ROOT.parent)}:{line}: {PACKAGE}.{module} "
                    f"({LAYERS[own][0]}) imports {PACKAGE}.{imported} ({LAYERS[target][0]})"
                )
    assert not violations, "imports of a higher layer:\n" + "\n".join(violations)


def test_the_check_sees_function_level_imports_and_skips_type_checking():
    # The parser itself: a function-level import counts, a TYPE_CHECKING one does not.
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .engine import ECCache\n"
        "def f():\n"
        "    from . import inventory\n"
    )
    tree = ast.parse(source)
    seen = [
        alias.name
        for node in _runtime_nodes(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    ]
    assert sorted(seen) == ["TYPE_CHECKING", "inventory"]
    assert layer_of("inventory") > layer_of("engine") > layer_of("reads") > layer_of("tiers")
    assert layer_of("tiers.local_disk") < layer_of("remote.backend") < layer_of("tiers.manager")
    assert layer_of("integration.vllm.worker") == layer_of("integration.vllm")
