"""No import circles among kvscope's modules.

A circle makes a module's import order matter (one of them runs against the other half
initialized) and ties rooms together that should change apart. The graph is read from the
source (AST), every import counted wherever it stands: at module level, inside a function
(an import moved there to dodge a circle is still a circle) and under ``TYPE_CHECKING``;
relative and absolute. The modules are those pyproject's ``package-dir`` maps into
``kvscope`` (``connector/`` is ``kvscope.connector``, ...).

Edges are the imports as written: ``import a.b`` depends on ``a.b``; ``from a import b``
on ``a`` (whatever its ``__init__`` runs) and on ``a.b`` where that is a module. So a
package whose ``__init__`` imports its modules forms a circle with any of them that
imports ``from`` the package.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules(root: Path) -> dict[str, Path]:
    """Every module of the distribution: its dotted name -> its file."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dirs = config["package-dir"]
    found: dict[str, Path] = {}
    # deepest folder last, so a package mapped on its own wins over its parent's walk
    for package, folder in sorted(package_dirs.items(), key=lambda kv: len(kv[1])):
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The modules of ``known`` that ``name`` (at ``path``) imports, anywhere in it."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    return {t for t in targets if t in known and t != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    return {name: imports(name, path, mods) for name, path in mods.items()}


def test_kvscope_has_no_import_circles():
    graph = import_graph(ROOT)
    assert "kvscope.connector.observed" in graph and "kvscope.sim.cpu_engine" in graph
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def _tree(root: Path, files: dict[str, str]) -> Path:
    (root / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"kvscope" = "kvscope"\n"kvscope.connector" = "connector"\n')
    for rel, text in {"kvscope/__init__.py": "", "connector/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    graph = import_graph(_tree(tmp_path, {
        "connector/a.py": "from kvscope.connector import b\n",
        "connector/b.py": "def f():\n    from .a import g\n",
        "connector/c.py": "from . import a\n",
    }))
    assert circles(graph) == [["kvscope.connector.a", "kvscope.connector.b"]]


def test_circles_through_type_checking_and_a_package_init_are_found(tmp_path):
    graph = import_graph(_tree(tmp_path, {
        "kvscope/sim/__init__.py": "from .engine import Engine\n",
        "kvscope/sim/engine.py": "from kvscope.sim import step\n",
        "kvscope/sim/step.py": ("from typing import TYPE_CHECKING\n"
                                "if TYPE_CHECKING:\n    import kvscope.connector.a\n"),
        "connector/a.py": "import kvscope.sim.step\n",
    }))
    assert sorted(circles(graph)) == [["kvscope.connector.a", "kvscope.sim.step"],
                                      ["kvscope.sim", "kvscope.sim.engine"]]
