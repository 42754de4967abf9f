"""--each-engine: a window of several engines cut per engine, each judged alone.

Synthetic windows (the rule on one input): engine A idles with a store stuck 96 s (pending
at idle on its own), engine B is healthy. Whole, the window is inconclusive (one_engine.py);
cut, each engine's verdict must be the one it gets asked alone, and the exit code says
the incident. A window that cannot be cut (a series naming no engine, a target that gave
nothing) is judged whole, as before, with the reason in its notes. The same against two
real engines through a real Prometheus: test_engines_live.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvscope.diagnostics import cli
from kvscope.diagnostics.report.diagnosis import (
    EXIT_CANNOT,
    EXIT_HEALTHY,
    EXIT_INCIDENT,
    EXIT_INCONCLUSIVE,
    format_text,
)
from kvscope.diagnostics.sources.bundle import write_bundle
from kvscope.diagnostics.verdict import per_engine
from kvscope.diagnostics.verdict.diagnose import diagnose_raw
from kvscope.exporters import signals as S

from . import test_classifiers as C
from .support import L, engine_on, window
from .test_golden import _healthy

A = "10.0.0.1:9400"
B = "10.0.0.2:9400"


def _serving() -> dict:
    """A healthy engine with requests running."""
    d = _healthy()
    d[L(S.REQUESTS.name, state="running")] = [3, 3]
    return d


def _two(a=None, b=None):
    values = engine_on(A, a if a is not None else C.pending_case()) \
        | engine_on(B, b if b is not None else _serving())
    return window(values, lifetime=False, declare=False)


def _alone(target, values):
    return diagnose_raw(window(engine_on(target, values), lifetime=False, declare=False))


def test_each_engine_gets_the_verdict_it_gets_asked_alone():
    raw = _two()
    whole = diagnose_raw(raw)  # B's work hides A's stuck store: the sums cannot say
    assert whole.status == "inconclusive", format_text(whole)
    parts, why = per_engine.split(raw)
    assert why == "" and [k for k, _ in parts] == [A, B]
    assert sum(len(sub.series) for _, sub in parts) == len(raw.series)  # every series, once
    verdicts = per_engine.diagnose_each(parts)
    alone_a, alone_b = _alone(A, C.pending_case()), _alone(B, _serving())
    assert alone_a.top.id == "pending_at_idle" and alone_b.status == "healthy"
    got = {v.engine: v.report for v in verdicts}
    assert [f.id for f in got[A].verdicts] == [f.id for f in alone_a.verdicts], \
        format_text(got[A])
    assert got[B].status == "healthy", format_text(got[B])
    assert per_engine.exit_code(verdicts) == EXIT_INCIDENT
    text = per_engine.format_each(verdicts)
    assert text.startswith(f"kv-diagnose --each-engine: 2 engines, incident (incident: {A}; "
                           f"healthy: {B})"), text
    assert f"=== engine {A}: incident ===" in text and f"=== engine {B}: healthy ===" in text


def test_an_incident_on_either_engine_is_found_whichever_serves():
    """The veto on B beside a healthy A: B's incident, A healthy."""
    verdicts = per_engine.diagnose_each(per_engine.split(_two(_healthy(), C.veto_case()))[0])
    got = {v.engine: v for v in verdicts}
    assert got[A].status == "healthy" and got[B].report.top.id == "capacity_ceiling_veto"


def test_two_healthy_engines_are_healthy_only_together():
    verdicts = per_engine.diagnose_each(per_engine.split(_two(_healthy(), _healthy()))[0])
    assert per_engine.exit_code(verdicts) == EXIT_HEALTHY
    # one engine that cannot be judged (its steps, and so its freshness, are missing
    # while the rest is there: "could not check") keeps the whole run from healthy
    b = {k: v for k, v in _healthy().items() if k != S.LAST_STEP_TIMESTAMP.name}
    verdicts = per_engine.diagnose_each(per_engine.split(_two(_healthy(), b))[0])
    assert {v.engine: v.status for v in verdicts}[A] == "healthy"
    assert per_engine.exit_code(verdicts) == EXIT_INCONCLUSIVE, \
        per_engine.format_each(verdicts)


class _Coded(per_engine.EngineVerdict):
    """An engine's verdict with only its exit code (the combining rule's input)."""

    def __init__(self, code: int) -> None:
        super().__init__("x", None)
        self.code = code

    @property
    def exit_code(self) -> int:
        return self.code


def test_exit_codes_combine_never_to_healthy_over_a_gap():
    combos = {(0, 0): 0, (0, 1): 1, (3, 1): 1, (2, 1): 1, (0, 3): 3, (0, 2): 3, (2, 3): 3,
              (2, 2): 2}
    for (x, y), want in combos.items():
        assert per_engine.exit_code([_Coded(x), _Coded(y)]) == want, (x, y)


def test_a_series_that_names_no_engine_keeps_the_window_whole():
    """A worker rank's standalone endpoint (port + 1 + rank): its series carry no
    kvscope_info and no engine label, so which engine it serves is unknown."""
    rank = "10.0.0.1:9401"
    raw = window(engine_on(A, C.pending_case()) | engine_on(B, _serving()) | engine_on(rank, {
        L(S.TRANSFERS_IN_FLIGHT.name, rank="0", direction="gpu_to_cpu"): [0, 0]}),
        lifetime=False, declare=False)
    parts, why = per_engine.split(raw)
    assert parts == [] and rank in why and "name no engine" in why


def test_a_target_that_gave_nothing_keeps_the_window_whole():
    raw = dataclasses.replace(_two(), failures=("rank endpoint http://10.0.0.3:9401 "
                                                "unreachable: refused",))
    parts, why = per_engine.split(raw)
    assert parts == [] and "1 target(s) gave nothing usable" in why


def test_one_engine_is_not_cut():
    raw = window(engine_on(A, _healthy()), lifetime=False, declare=False)
    assert per_engine.split(raw) == ([], "")


def _bundle(tmp_path, raw) -> str:
    path = str(tmp_path / "w.kvb")
    write_bundle(raw, path)
    return path


def test_the_cli_cuts_a_bundle_per_engine(tmp_path, capsys):
    path = _bundle(tmp_path, _two())
    assert cli.main(["--bundle", path, "--each-engine"]) == EXIT_INCIDENT
    out = capsys.readouterr().out
    assert f"=== engine {A}: incident ===" in out and "pending" in out.lower(), out
    assert cli.main(["--bundle", path, "--each-engine", "--json"]) == EXIT_INCIDENT
    doc = json.loads(capsys.readouterr().out)
    assert doc["each_engine"] is True and doc["status"] == "incident"
    assert [(e["engine"], e["status"]) for e in doc["engines"]] == [(A, "incident"),
                                                                   (B, "healthy")]
    assert doc["engines"][0]["report"]["verdicts"][0]["id"] == "pending_at_idle"
    # without the flag: the whole window, inconclusive as before
    assert cli.main(["--bundle", path]) == EXIT_INCONCLUSIVE


def test_the_cli_judges_an_uncut_window_whole_and_says_why(tmp_path, capsys):
    raw = dataclasses.replace(_two(), failures=("rank endpoint http://10.0.0.3:9401 "
                                                "unreachable: refused",))
    code = cli.main(["--bundle", _bundle(tmp_path, raw), "--each-engine"])
    out = capsys.readouterr().out
    assert code != EXIT_HEALTHY
    assert "--each-engine: not cut per engine: 1 target(s) gave nothing usable" in out, out


@pytest.mark.parametrize("extra", [["--plot", "x.png"]])
def test_the_cli_refuses_a_plot_of_several_engines(tmp_path, capsys, extra):
    path = _bundle(tmp_path, _two())
    assert cli.main(["--bundle", path, "--each-engine", *extra]) == EXIT_CANNOT
    assert "--plot draws one engine's window" in capsys.readouterr().err
