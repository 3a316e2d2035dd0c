"""Imports point one way: no module of lmcache_ec imports a module of a higher layer.

The layers, lowest first, are those of docs/architecture.md ("Layers"). A
module may import its own layer and the layers below it. Imports inside
functions count as much as those at the top of a file; only imports under
``if TYPE_CHECKING:`` (annotations, never executed) are exempt. A new module
must be placed in a layer here, or this test fails naming it. Each folder is
one layer, the import graph has no cycle, and no two modules share a file name.

The graph's counts: ``python -m tests.test_layers`` (or ``pytest -s`` on this file).
"""

from __future__ import annotations

import ast
from collections import Counter
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
            "flocks",
            "config_schema",
            "config",
            "metrics",
            "metrics_export",
            "runtime_dirs",
            "tier_contract",
            "remote_names",
        ),
    ),
    ("tiers", ("tiers.*",)),
    ("remote", ("remote.*",)),
    ("storage", ("storage.*",)),
    ("purge", ("purge.*",)),
    ("engine", ("engine",)),
    ("integration", ("integration.*",)),
    ("entry points", ("", "cli.*", "bench.*")),
]

# Modules at the top of the package: the foundation and the public facade.
TOP_LEVEL_LAYERS = ("foundation", "engine", "entry points")


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
    violations = imports_up()
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
    assert layer_of("engine") > layer_of("purge.inventory") > layer_of("storage.reads")
    assert layer_of("storage.reads") > layer_of("tiers")
    assert layer_of("tiers.local_disk") < layer_of("remote.backend") < layer_of("storage.manager")
    assert layer_of("integration.vllm.worker") == layer_of("integration.vllm")


def import_graph() -> dict[str, set[str]]:
    """Each module and the package modules it imports at run time (itself excluded)."""
    return {
        module: {name for _, name in imports_of(module) if name != module and name in MODULES}
        for module in MODULES
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def imports_up() -> list[str]:
    """Every import of a higher layer, as ``file:line: importer (layer) imports ...``."""
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
    return violations


def folder_of(module: str) -> str:
    """The top folder a module lives in; "" for the modules at the top of the package."""
    path = MODULES[module]
    parts = path.relative_to(ROOT).parts
    return parts[0] if len(parts) > 1 else ""


def folders_in_several_layers() -> dict[str, list[str]]:
    """Folders whose modules are not all of one layer: folder -> its layers."""
    layers: dict[str, set[str]] = {}
    for module in MODULES:
        own = layer_of(module)
        if own is None or not folder_of(module):
            continue
        layers.setdefault(folder_of(module), set()).add(LAYERS[own][0])
    return {folder: sorted(names) for folder, names in sorted(layers.items()) if len(names) > 1}


def shared_file_names() -> dict[str, list[str]]:
    """File names (``__init__.py`` aside) used by more than one module."""
    names = Counter(path.name for path in MODULES.values() if path.name != "__init__.py")
    return {
        name: sorted(str(p.relative_to(ROOT)) for p in MODULES.values() if p.name == name)
        for name, count in sorted(names.items())
        if count > 1
    }


def summary() -> str:
    graph = import_graph()
    folder_graph: dict[str, set[str]] = {}
    for module, targets in graph.items():
        # Top-level modules stand for themselves; a folder is one node.
        node = folder_of(module) or module
        folder_graph.setdefault(node, set()).update(
            folder_of(target) or target for target in targets
        )
    for node, targets in folder_graph.items():
        targets.discard(node)
    module_cycles = cycles(graph)
    folder_cycles = cycles(folder_graph)
    lines = [
        f"import graph of {PACKAGE}: {len(MODULES)} modules, {len(LAYERS)} layers, "
        f"{sum(len(t) for t in graph.values())} imports, {len(module_cycles)} cycles, "
        f"{len(imports_up())} imports back up a layer, "
        f"{len(folders_in_several_layers())} folders in several layers, "
        f"{len(folder_cycles)} cycles between folders and top-level modules, "
        f"{len(shared_file_names())} file names shared",
    ]
    lines += [f"  cycle: {' -> '.join(c)}" for c in module_cycles]
    lines += [
        f"  folder in several layers: {f}/ {ls}" for f, ls in folders_in_several_layers().items()
    ]
    lines += [f"  cycle between folders: {' -> '.join(c)}" for c in folder_cycles]
    lines += [f"  shared file name: {n} {ps}" for n, ps in shared_file_names().items()]
    return "\n".join(lines)


def test_the_import_graph_has_no_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_each_folder_is_one_layer_and_the_top_level_only_foundation_and_facade():
    assert not folders_in_several_layers()
    top = {
        module: LAYERS[layer_of(module)][0]
        for module in MODULES
        if not folder_of(module) and layer_of(module) is not None
    }
    assert all(layer in TOP_LEVEL_LAYERS for layer in top.values()), top
    assert [m for m, layer in top.items() if layer == "entry points"] == [""]  # __init__


def test_no_two_modules_share_a_file_name():
    assert not shared_file_names()


def test_print_the_graph_summary():
    print(summary())  # shown with -s
    assert f"{len(MODULES)} modules" in summary()


if __name__ == "__main__":
    print(summary())
