"""No import circles among kvscope's modules.

A circle makes a module's import order matter (one of them runs against the other half
initialized) and ties rooms together that should change apart. Every import counts,
wherever it stands (``tests/support/import_graph.py``): one moved into a function to dodge
a circle is still a circle, and so is one under ``TYPE_CHECKING``. A package whose
``__init__`` imports its modules forms a circle with any of them that imports ``from`` the
package.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.import_graph import ROOT, circles, import_graph


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
