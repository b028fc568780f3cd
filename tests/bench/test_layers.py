"""The Python layers import one way: the nanoccl package, then the reference trainers, then
the tools (bench/) and the tests.

Read from the sources (every import statement, those inside functions too), not by importing:
- no module of the package imports trainers/ or a tool of bench/ (what the package needs of
  them runs as a program: the probes and nanoccl-advise --check);
- the trainers import no tool;
- the package's modules have no import cycle. A submodule may import the package itself
  (``import nanoccl``, ``from nanoccl import _C``): those edges are left out, since the
  package's __init__ only loads the extension and re-exports, and a submodule reads what it
  took from the package when it is called, not when it is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from bench_helpers import REPO

PACKAGE = REPO / "torch_ext" / "nanoccl"
TOOLS = {p.stem for p in (REPO / "bench").rglob("*.py")}


def imported_names(path: Path) -> set[str]:
    """Every module name an import statement of `path` names (``from a import b``: a and a.b)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: within the package
                base = "nanoccl" + (f".{base}" if base else "")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def package_modules() -> dict[str, Path]:
    return {("nanoccl" if p.stem == "__init__" else f"nanoccl.{p.stem}"): p
            for p in PACKAGE.glob("*.py")}


def test_the_package_imports_neither_the_trainers_nor_the_tools() -> None:
    upward = {}
    for module, path in package_modules().items():
        bad = {n for n in imported_names(path)
               if n.split(".")[0] in ("trainers", "bench") or n.split(".")[0] in TOOLS}
        if bad:
            upward[module] = sorted(bad)
    assert not upward, f"package modules importing trainers/ or bench/: {upward}"


def test_the_trainers_import_no_tool() -> None:
    for path in (REPO / "trainers").glob("*.py"):
        bad = {n for n in imported_names(path)
               if n.split(".")[0] == "bench" or n.split(".")[0] in TOOLS}
        assert not bad, f"{path.name} imports tools: {sorted(bad)}"


def test_the_package_modules_import_one_way() -> None:
    modules = package_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = set()
        for name in imported_names(path):
            target = name if name in modules else name.rpartition(".")[0]
            if target in modules and target not in (module, "nanoccl"):
                edges.add(target)
        graph[module] = edges
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_package_root_imports_no_module_that_imports_it() -> None:
    """The edges left out above may not close a cycle through the package's __init__."""
    modules = package_modules()
    root = imported_names(modules["nanoccl"])
    back = sorted(m for m, path in modules.items()
                  if m != "nanoccl" and m in root and "nanoccl" in imported_names(path))
    assert not back, f"the package's __init__ imports modules that import it back: {back}"


def test_the_check_sees_a_cycle(tmp_path: Path) -> None:
    """The reader of imports finds what the graph is made of (a function-level import)."""
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from nanoccl.perf import main\n    import trainers.models\n")
    assert {"nanoccl.perf", "nanoccl.perf.main", "trainers.models"} <= imported_names(a)
