"""VictoriaMetrics as a second PromQL engine, over the recorded fault campaigns.

Debian's ``victoria-metrics`` (1.79.5, which ships ``vmalert``) is given every sample of the
recordings that test_campaign_replay.py backfills into a real Prometheus, and ``vmalert
-replay`` backfills the recording rules and evaluates the alert rules
(``tests/support/campaign_replay_vm.py``). Against the Prometheus replaying the same recordings
(``campaign_prom``, conftest.py), for every judged phase:

* ``kv-diagnose --prometheus <VictoriaMetrics>`` gives the same verdicts, exit code and
  unchecked reasons, and the verdict the phase's fault calls for (``EXPECTED``);
* the alerts that start in the phase are the same, with the same labels: as vmalert fires them
  and as the query_range emulation (``campaign_replay.firing``) reads them on either engine;
* every dashboard query, recording rule and variable parses on VictoriaMetrics and selects
  the same series as on Prometheus; every alert expression parses.

Values differ where the engines do by design (docs/promql-engines.md): MetricsQL's rate() and
increase() do not extrapolate, and a series ends within a few sample intervals of its last
sample instead of Prometheus' 5 minutes of lookback. None of kvscope's queries is changed for
it: the verdicts and alerts above are what the tests hold equal.
"""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from kvscope import durations
from kvscope.dashboards import rules as r
from kvscope.dashboards.artifacts import queries
from kvscope.diagnostics import cli
from tests.dashboards import live
from tests.dashboards.test_campaign_replay import (
    EXPECTED,
    IDS,
    PHASES,
    _diagnose,
    judged,
    window_args,
)
from tests.support import querycheck as qc
from tests.support.victoriametrics import require_binaries

replay = pytest.importorskip("tests.support.campaign_replay")
replay_vm = pytest.importorskip("tests.support.campaign_replay_vm")

pytestmark = [pytest.mark.prometheus, pytest.mark.victoriametrics]


@pytest.fixture(scope="module")
def vm():
    require_binaries()
    if not replay.recordings():
        pytest.skip("no campaign recordings committed")
    with replay_vm.replayed_vm() as v:
        yield v


def _kv_diagnose(url: str, phase: dict) -> tuple[int, dict]:
    """kv-diagnose's own entry point, in this process (the same code the command runs)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--prometheus", url, *window_args(phase), "--json"])
    return code, json.loads(out.getvalue())


def _outcome(code: int, doc: dict) -> tuple:
    return (code, [v["id"] for v in doc["verdicts"]],
            sorted(r for u in doc["unchecked"] for r in u["reasons"]))


@pytest.mark.parametrize("phase", PHASES, ids=IDS)
def test_kv_diagnose_gives_the_same_verdict(campaign_prom, vm, phase):
    on_prom = _kv_diagnose(campaign_prom.url, phase)
    on_vm = _kv_diagnose(vm.url, phase)
    assert _outcome(*on_vm) == _outcome(*on_prom)
    _, verdict = EXPECTED[(phase["run"], phase["name"])]
    code, ids = judged(*on_vm, phase["run"])
    assert ids[0] == verdict and code == (0 if verdict == "healthy" else 1), ids


def test_kv_diagnose_command_exits_with_the_verdict(vm, tmp_path):
    """The command as an operator runs it (a process, its exit code), and a bundle recorded
    from VictoriaMetrics diagnosed offline."""
    phase = next(p for p in PHASES if (p["run"], p["name"]) == ("faults-cpu", "disk_full"))
    code, ids = _diagnose("--prometheus", vm.url, *window_args(phase), run=phase["run"])
    assert (code, ids[0]) == (1, "tier_writes_failing"), ids
    bundle = tmp_path / "phase.kvb"
    assert cli.main(["record", "--prometheus", vm.url, *window_args(phase),
                     "-o", str(bundle)]) == 0
    code, ids = _diagnose("--bundle", str(bundle), run=phase["run"])
    assert (code, ids[0]) == (1, "tier_writes_failing"), ids


def _started(firings: list, phase: dict) -> set[tuple]:
    # an alert's labels are its expression's without __name__ (Prometheus' rule manager and
    # vmalert both drop it; a comparison like "x > 0" keeps it in the query's answer)
    return {(f.alert, tuple(sorted((k, v) for k, v in f.labels.items() if k != "__name__")))
            for f in firings if f.active_from >= phase["start"]}


@pytest.mark.parametrize("phase", PHASES, ids=IDS)
def test_the_same_alerts_start(campaign_prom, vm, phase):
    """Alerts still firing from an earlier phase are left out: whether one still fires at a
    phase's first evaluation depends on where the evaluation grid falls, not on the engine."""
    start, end = phase["start"], phase["end"]
    on_prom = _started(replay.firing(campaign_prom, start, end), phase)
    assert _started(replay_vm.vmalert_firing(vm, start, end), phase) == on_prom
    assert _started(replay.firing(vm, start, end), phase) == on_prom
    # what test_alerts judges on Prometheus, judged on vmalert's own firing alerts
    want, _ = EXPECTED[(phase["run"], phase["name"])]
    assert {alert for alert, _ in on_prom} <= want
    if r.ALERT_CHECKSUM_MISMATCH in want:
        # still firing at the phase's end (a second fault's mismatches may extend the first's
        # alert rather than start one), on the rank whose copy was wrong
        step = durations.seconds(replay.CAMPAIGN_CONFIG.rule_interval)
        at_end = replay_vm.vmalert_firing(vm, end - step, end)
        assert {f.labels.get("rank") for f in at_end
                if f.alert == r.ALERT_CHECKSUM_MISMATCH} == {"1"}, at_end
    else:
        assert {alert for alert, _ in on_prom} == want


def _series(engine, expr: str, start: float, end: float) -> set[tuple]:
    return {tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__"))
            for s in engine.query_range(expr, start, end, 5)}


def test_every_query_selects_the_same_series(campaign_prom, vm):
    """Panels, recording rules (their expressions, and the series vmalert recorded against
    those promtool recorded) and template variables, over the whole campaign."""
    start, end = replay.span()
    differ, evaluated, total = [], 0, 0
    for q in queries(replay.CAMPAIGN_CONFIG):
        exprs = [qc.substitute(q.expr)]
        if q.kind == "variable":
            metric, label = re.match(r"label_values\((.+),\s*(\w+)\)$", exprs[0]).groups()
            exprs = [f"count by ({label}) ({metric})"]
        elif q.kind == "record":
            exprs.append(q.name)
        elif q.kind != "panel":
            continue
        for expr in exprs:
            on_prom = _series(campaign_prom, expr, start, end)
            evaluated, total = evaluated + bool(on_prom), total + 1
            if _series(vm, expr, start, end) != on_prom:
                differ.append(f"{q.source}: {q.kind} {q.name}: {expr}")
    assert not differ, differ
    # the campaign feeds most of them (not empty on both engines alike): all but the panels
    # of vLLM >= 0.33's own metrics (the campaign ran vLLM 0.26)
    assert evaluated > total * 3 // 4, (evaluated, total)


def test_every_committed_query_parses(vm):
    """What users deploy (the committed files, production windows), as querycheck runs it."""
    problems = qc.check_live(vm, live.committed_queries())
    assert not problems, problems
