"""The scenario catalogue (kvscope.sim.catalog): one entry per scenario, readable
without vLLM, naming run functions that exist and verdicts kv-diagnose can give."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from kvscope.diagnostics import classifiers
from kvscope.sim import catalog

SCENARIOS_PY = Path(catalog.__file__).with_name("scenarios.py")
KVSCOPE = os.path.join(os.path.dirname(sys.executable), "kvscope")
HEAVY = ("vllm", "torch", "transformers")


def test_kvscope_scenarios_lists_the_catalogue_quietly():
    proc = subprocess.run([KVSCOPE, "scenarios"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    listed = [line.split()[0] for line in proc.stdout.splitlines()]
    assert listed == list(catalog.SCENARIOS)
    for line, s in zip(proc.stdout.splitlines(), catalog.SCENARIOS.values()):
        assert line.endswith(s.doc), line


def test_the_listing_and_a_usage_error_import_no_vllm_nor_torch():
    probe = ("import sys\n"
             "from kvscope.cli import main\n"
             "assert main(['scenarios']) == 0\n"
             "assert main(['demo', 'no-such-scenario']) == 2\n"
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    *usage, imported = proc.stderr.splitlines()
    assert usage == ["kvscope demo: unknown scenario 'no-such-scenario'; one of: "
                     + ", ".join(catalog.SCENARIOS)], proc.stderr
    assert imported == "[]", proc.stderr


def test_every_entry_names_a_run_function_of_the_harness():
    """Checked on the source: importing kvscope.sim.scenarios would import vLLM."""
    tree = ast.parse(SCENARIOS_PY.read_text())
    functions = {f.name: [a.arg for a in f.args.args] for f in tree.body
                 if isinstance(f, ast.FunctionDef)}
    for s in catalog.CATALOG.values():
        assert functions.get(s.run, [])[:2] == ["run", "cfg"], (s.name, s.run)


def test_every_expected_verdict_is_one_kv_diagnose_gives():
    ids = {mod.ID for mod in classifiers.CLASSIFIERS} | {"healthy"}
    for s in catalog.CATALOG.values():
        assert s.expected_verdict in ids, s
        assert s.doc and s.premise_doc, s


def test_variants_are_not_catalogued_incidents():
    assert "stale-rows-hybrid" in catalog.CATALOG
    assert "stale-rows-hybrid" not in catalog.SCENARIOS
    assert all(not s.variant for s in catalog.SCENARIOS.values())
