"""The tests stand alone: none imports from benchmarks/ or reads a file under it.

Benchmarks are scripts that answer questions on a machine of their own; their results
change when they are re-run, and their code may go. Harness code a test exercises lives in
kvscope/sim/ or tests/support/, recorded runs a test reads in tests/fixtures/. Checked on
every Python file under tests/ (recorded outputs under fixtures are data, not code): no
import of ``benchmarks``, no ``benchmarks/`` path, no ``"benchmarks"`` path part, no
``sys.path`` entry pointing there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# a path under benchmarks/ in any spelling a test could read it by: "benchmarks/x",
# ROOT / "benchmarks", syspath_prepend("benchmarks")
PATH = re.compile(r"""\bbenchmarks/|["']benchmarks["']""")


def _imports_benchmarks(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                  "import_module", "importorskip", "__import__")):
            names = [node.args[0].value]
        else:
            continue
        if any(n == "benchmarks" or n.startswith("benchmarks.") for n in names):
            lines.append(node.lineno)
    return lines


def violations(root: Path = TESTS) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        text = path.read_text()
        found += [f"{rel}:{n}: imports benchmarks" for n in _imports_benchmarks(ast.parse(text))]
        found += [f"{rel}:{n}: names a path under benchmarks/: {line.strip()}"
                  for n, line in enumerate(text.splitlines(), 1)
                  if PATH.search(line) and path != Path(__file__).resolve()]
    return found


def test_no_test_imports_from_benchmarks_or_reads_a_file_under_it():
    assert violations() == []


def test_the_check_sees_each_way_a_test_could_reach_benchmarks(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_ok.py").write_text("from kvscope.sim import pair_stats\n"
                                      "# a benchmark's question, named without its path\n")
    (tests / "test_import.py").write_text("from benchmarks import gpu_oracle\n")
    (tests / "test_import_module.py").write_text("import benchmarks.soak_report\n")
    (tests / "test_skip.py").write_text(
        "import pytest\nr = pytest.importorskip('benchmarks.campaign_replay')\n")
    (tests / "test_path.py").write_text(
        "from pathlib import Path\nR = Path(__file__).parents[1] / \"benchmarks\" / \"results\"\n")
    (tests / "test_doc.py").write_text('"""Run benchmarks/soak.py first."""\n')
    found = violations(tests)
    assert [v.split(":")[0] for v in found] == [
        "tests/test_doc.py", "tests/test_import.py", "tests/test_import_module.py",
        "tests/test_path.py", "tests/test_skip.py"]
