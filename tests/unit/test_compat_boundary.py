"""vLLM is reached only through the compat layer (``connector/compat/``).

Outside it, production code neither imports vLLM nor touches a private attribute
kvscope did not define itself (``obj._x``, ``self._x`` inherited from a vLLM class,
``getattr(obj, "_x")``). The CPU harness and the test-only fault hooks build vLLM
objects of their own and are exempt, as the compat layer itself is.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ["connector", "exporters", "kvscope", "dashboards", "diagnostics"]
EXEMPT = {
    "connector/compat",  # the layer itself
    # the CPU harness (kvscope.sim, its test-only fault hooks among it): it builds vLLM
    # objects itself
    "kvscope/sim",
}


def _modules(exempt: bool) -> list[Path]:
    out = []
    for top in PRODUCTION:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if any(rel == e or rel.startswith(e + "/") for e in EXEMPT) == exempt:
                out.append(path)
    return out


def _own_private_names(paths: list[Path]) -> set[str]:
    """Private names kvscope defines: methods, class/module names, attributes it assigns."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Call) and _sets_own_attribute(node):
                names.add(node.args[1].value)  # object.__setattr__(self, "_inner", ...)
            elif (isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)):
                names.update(c.value for c in ast.walk(node.value)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return {n for n in names if n.startswith("_")}


# Private names of other libraries the code may use (not vLLM's).
NOT_VLLM = {"_SubParsersAction"}  # argparse: the type of add_subparsers()'s result


def _sets_own_attribute(call: ast.Call) -> bool:
    """``setattr(self, "_x", v)`` / ``object.__setattr__(self, "_x", v)``."""
    f = call.func
    named = ((isinstance(f, ast.Name) and f.id == "setattr")
             or (isinstance(f, ast.Attribute) and f.attr == "__setattr__"))
    return (named and len(call.args) == 3 and isinstance(call.args[0], ast.Name)
            and call.args[0].id == "self" and isinstance(call.args[1], ast.Constant)
            and isinstance(call.args[1].value, str))


def _private(name: str) -> bool:
    return (name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            and name not in NOT_VLLM)


def violations() -> list[str]:
    checked = _modules(exempt=False)
    own = _own_private_names(checked)
    found = []
    for path in checked:
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [f"{where} import {a.name}" for a in node.names
                          if a.name.split(".")[0] == "vllm"]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                found.append(f"{where} from {node.module} import ...")
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                found.append(f"{where} .{node.attr}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
                  and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str) and _private(node.args[1].value)
                  and node.args[1].value not in own):
                found.append(f"{where} {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_vllm_only_through_the_compat_layer():
    assert violations() == []


def test_the_check_sees_what_it_must(tmp_path, monkeypatch):
    """A vLLM import and a private vLLM attribute in a production module are reported."""
    bad = ROOT / "exporters" / "_boundary_probe_tmp.py"
    bad.write_text("from vllm.v1 import request\n"
                   "def f(scheduler):\n"
                   "    return scheduler._req_status, getattr(scheduler, '_transfer_jobs')\n")
    try:
        found = violations()
    finally:
        bad.unlink()
    probe = [v for v in found if "_boundary_probe_tmp" in v]
    assert len(probe) == 3, probe
