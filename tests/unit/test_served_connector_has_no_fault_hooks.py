"""The served connector carries no test fault hook.

The fault hooks (``kvscope/sim/faults.py``) belong to the CPU harness and the fault
campaigns, which select ``kvscope.sim.fault_connector.FaultInjectingConnector``. What vLLM
loads as kvscope's connector (``kvscope.connector``, everything it imports) reaches neither,
however indirectly: no module of the CPU harness is imported, and no source of the served
connector names the hooks' switch. On vLLM, ``tests/connector/test_faults.py`` checks that a
default-built connector ignores a switched-on fault.
"""

from __future__ import annotations

from tests.support.import_graph import ROOT, import_graph, modules, reached

SERVED = "kvscope.connector"
HARNESS = "kvscope.sim"


def _served(graph: dict[str, set[str]]) -> set[str]:
    start = {m for m in graph if m == SERVED or m.startswith(SERVED + ".")}
    return start | reached(graph, start)


def test_the_served_connector_imports_nothing_of_the_harness():
    graph = import_graph(ROOT)
    assert f"{HARNESS}.faults" in graph and f"{HARNESS}.fault_connector" in graph
    served = _served(graph)
    assert f"{SERVED}.observed" in served and "kvscope.exporters.recorder" in served
    harness = sorted(m for m in served if m == HARNESS or m.startswith(HARNESS + "."))
    assert not harness, f"the served connector imports the CPU harness: {harness}"


def test_no_served_source_names_the_fault_switch():
    mods = modules(ROOT)
    named = sorted(m for m in _served(import_graph(ROOT))
                   if "KVSCOPE_FAULT_FILE" in mods[m].read_text())
    assert not named, f"served modules naming the fault switch: {named}"


def test_the_check_sees_a_harness_import(tmp_path):
    """The check can fail: a served module importing the hooks' module, even inside a
    function, is found."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"kvscope" = "kvscope"\n"kvscope.connector" = "connector"\n')
    for rel, text in {"kvscope/__init__.py": "", "kvscope/sim/__init__.py": "",
                      "kvscope/sim/faults.py": "", "connector/__init__.py": "",
                      "connector/observed.py": "def f():\n    from kvscope.sim import faults\n",
                      }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert {"kvscope.sim", "kvscope.sim.faults"} <= _served(import_graph(tmp_path))
