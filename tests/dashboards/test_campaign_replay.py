"""The GPU fault campaign, replayed from its committed recordings in a real Prometheus.

``benchmarks/gpu_campaign.py`` ran `vllm serve` (TP=2 on two H200s) with one fault per
phase and recorded vLLM's /metrics and both ranks' kvscope endpoints every second
(``benchmarks/results/campaign``). Here, without a GPU, the recordings are backfilled with
``promtool tsdb create-blocks-from openmetrics`` (recording rules with ``create-blocks-from
rules``) into a real Prometheus (``benchmarks/campaign_replay.py``), and then:

* the alert rules (campaign windows, ``CAMPAIGN_CONFIG``) fire the phase's alert and no
  other starts firing there; the clean control fires none;
* every dashboard panel and recording rule returns data over the campaign;
* ``kv-diagnose --prometheus`` and ``kv-diagnose record`` + ``--bundle`` name each phase.

Expectations come from the fault each phase injected (``EXPECTED``), not from the outcome.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvscope.dashboards import rules as r
from kvscope.dashboards.artifacts import queries
from tests.support import querycheck as qc
from tests.support.prometheus import require_binaries

replay = pytest.importorskip("benchmarks.campaign_replay")

pytestmark = pytest.mark.prometheus

# (run, phase) -> (alerts the fault must fire, kv-diagnose verdict)
MISMATCH = ({r.ALERT_CHECKSUM_MISMATCH}, "stale_row_corruption")
EXPECTED = {
    ("faults", "control"): (set(), "healthy"),
    ("faults", "flip_promoted"): MISMATCH,
    ("faults", "drop_promotion"): MISMATCH,
    ("stale-rows-observe", "stale-rows-observe"): MISMATCH,
    ("stale-rows-refuse", "stale-rows-refuse"): MISMATCH,
}
# Phases whose server was dead (vLLM 0.26 EngineCore died, README) are recorded but not judged.
PHASES = [p for p in replay.phases() if "error" not in p]
IDS = [f"{p['run']}:{p['name']}" for p in PHASES]


@pytest.fixture(scope="module")
def prom():
    require_binaries()
    if not replay.recordings():
        pytest.skip("no campaign recordings committed")
    with replay.replayed() as p:
        yield p


def test_every_judged_phase_has_an_expectation():
    assert PHASES, "the committed campaign has no phase that ran"
    assert {(p["run"], p["name"]) for p in PHASES} == set(EXPECTED)


@pytest.mark.parametrize("phase", PHASES, ids=IDS)
def test_alerts(prom, phase):
    want, _ = EXPECTED[(phase["run"], phase["name"])]
    fired = replay.firing(prom, phase["start"], phase["end"])
    started_here = {f.alert for f in fired if f.active_from >= phase["start"]}
    assert started_here <= want, fired
    if not want:
        assert fired == [], fired
        return
    # still firing at the phase's end: from this phase's own fault, since the previous
    # phase's evidence has left the windows by then
    step = replay.seconds(replay.CAMPAIGN_CONFIG.rule_interval)
    at_end = replay.firing(prom, phase["end"] - step, phase["end"])
    assert want <= {f.alert for f in at_end}, at_end
    if r.ALERT_CHECKSUM_MISMATCH in want:  # the rank whose copy was wrong: rank 1 only
        ranks = {f.labels.get("rank") for f in at_end if f.alert == r.ALERT_CHECKSUM_MISMATCH}
        assert ranks == {"1"}, at_end


def test_every_dashboard_query_returns_data(prom):
    start, end = replay.span()
    empty = []
    for q in queries(replay.CAMPAIGN_CONFIG):
        if q.kind in ("panel", "record") and not prom.query_range(qc.substitute(q.expr),
                                                                  start, end, 5):
            empty.append(f"{q.source}: {q.name}")
    assert not empty, empty


def _diagnose(*args: str) -> tuple[int, list[str]]:
    p = subprocess.run([sys.executable, "-m", "kvscope.diagnostics.cli", *args, "--json"],
                       capture_output=True, text=True, timeout=120)
    try:
        return p.returncode, [v["id"] for v in json.loads(p.stdout)["verdicts"]]
    except (ValueError, KeyError):
        raise AssertionError(f"kv-diagnose {args}: exit {p.returncode}: {p.stderr[-800:]}") from None


@pytest.mark.parametrize("phase", PHASES, ids=IDS)
def test_kv_diagnose_names_the_phase(prom, phase, tmp_path):
    _, verdict = EXPECTED[(phase["run"], phase["name"])]
    window = ["--start", f"{phase['start']:.3f}", "--end", f"{phase['end']:.3f}"]
    code, ids = _diagnose("--prometheus", prom.url, *window)
    assert ids[0] == verdict and code == (0 if verdict == "healthy" else 1), ids
    bundle = tmp_path / "phase.kvb"
    rec = subprocess.run([sys.executable, "-m", "kvscope.diagnostics.cli", "record",
                          "--prometheus", prom.url, *window, "-o", str(bundle)],
                         capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0, rec.stderr[-800:]
    code, ids = _diagnose("--bundle", str(bundle))
    assert ids[0] == verdict, ids
