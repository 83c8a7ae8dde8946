"""spbuild's modules import one another without cycles, counting the imports inside functions too (an import moved
into a function to dodge a cycle hides the cycle, it does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

import spbuild

PACKAGE = Path(spbuild.__file__).parent


def imports_of(path: Path, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "spbuild":
                found |= {a.name for a in node.names if a.name in modules}
            elif node.module.startswith("spbuild."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("spbuild.")}
    return found - {path.stem}


def import_graph() -> dict[str, set[str]]:
    files = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return {name: imports_of(path, set(files)) for name, path in files.items()}


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
    assert {"evaluate", "eval_cli", "reports", "sources", "snapshots"} <= set(graph)
    assert cycles(graph) == []
