"""kvscope's import graph, read from the source (AST): every module of the distribution
(pyproject's ``package-dir`` mapped into ``kvscope``: ``connector/`` is ``kvscope.connector``,
...) and the modules each imports, wherever the import stands: at module level, inside a
function, under ``TYPE_CHECKING``; relative and absolute.

Edges are the imports as written: ``import a.b`` depends on ``a.b``; ``from a import b``
on ``a`` (whatever its ``__init__`` runs) and on ``a.b`` where that is a module.
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




def reached(graph: dict[str, set[str]], start: Iterable[str]) -> set[str]:
    """Every module ``start``'s modules import, directly or through others."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen
