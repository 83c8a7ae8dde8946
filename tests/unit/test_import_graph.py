"""spbuild's modules import one another without cycles, counting the imports inside functions too (an import moved
into a function to dodge a cycle hides the cycle, it does not remove it), and so do its subpackages (tree, building,
upstream, measuring): each responsibility builds on the ones below it."""

from __future__ import annotations

import ast
from pathlib import Path

import spbuild

PACKAGE = Path(spbuild.__file__).parent


def module_name(path: Path) -> str:
    """'measuring.bench' for spbuild/measuring/bench.py, 'cli' for spbuild/cli.py."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                (node.module == "spbuild" or node.module.startswith("spbuild.")):
            base = node.module.removeprefix("spbuild").removeprefix(".")
            for alias in node.names:
                name = f"{base}.{alias.name}" if base else alias.name
                found.add(name if name in modules else base)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("spbuild.") for a in node.names if a.name.startswith("spbuild.")}
    return {m for m in found if m in modules} - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py") if p.stem not in ("__init__", "__main__")}
    return {name: imports_of(path, set(files)) for name, path in files.items()}


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The subpackages' imports of one another (top-level modules left out: cli sits above all, errors and console
    below all)."""
    def package(module: str) -> str | None:
        return module.split(".")[0] if "." in module else None
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        if package(module):
            out.setdefault(package(module), set()).update(
                p for p in map(package, deps) if p and p != package(module))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                found.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_spbuild_has_no_import_cycle():
    graph = import_graph()
    assert {"measuring.evaluate", "measuring.eval_cli", "measuring.reports", "tree.sources", "tree.snapshots"} <= \
        set(graph)
    assert graph["measuring.eval_cli"] >= {"measuring.evaluate", "measuring.reports"}  # the checker sees imports
    assert cycles(graph) == []


def test_the_subpackages_build_on_one_another_without_a_cycle():
    packages = package_graph(import_graph())
    assert set(packages) == {"tree", "building", "upstream", "measuring"}
    assert cycles(packages) == [], packages
    assert "tree" in packages["building"] and not packages["tree"], packages  # the tree is the bottom layer
