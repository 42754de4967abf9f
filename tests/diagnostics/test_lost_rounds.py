"""A truncated restore while kvscope's round judging fails: kv-diagnose must not say healthy.

The real vLLM CPU engine runs the truncated scenario (its premise, from the engine:
the re-ask restored fewer tokens than the tiers held) with the test fault
``lose_rounds`` on (kvscope/sim/faults.py): kvscope's judging of every lookup round
raises, is counted in ``kvscope_telemetry_errors_total`` and leaves no trace in the
round and coverage series. The classifiers then have nothing to find; before the
telemetry check (diagnostics/verdict/telemetry_gaps.py) this window read "healthy" during
the incident. Judged through a real Prometheus and from a live scrape.
"""

from __future__ import annotations

import time

import pytest

from kvscope.diagnostics import diagnose_prometheus, diagnose_scrape, format_text
from kvscope.diagnostics.report.diagnosis import EXIT_INCONCLUSIVE
from kvscope.diagnostics.verdict import telemetry_gaps
from kvscope.exporters import signals as S
from tests.support.reproduced import judged

from .test_scenarios import TH

pytestmark = pytest.mark.vllm


@pytest.fixture
def rounds_lost(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from kvscope.sim import faults

    path = str(tmp_path / "fault.json")
    faults.write_fault(path, faults.LOSE_ROUNDS)
    monkeypatch.setenv(faults.ENV, path)  # read when the connector is built


def _check(report) -> None:
    text = format_text(report)
    # the engine truncated the restore (judged() ran on such a run only): not healthy
    assert report.status == "inconclusive" and report.exit_code == EXIT_INCONCLUSIVE, text
    gap = [u for u in report.unchecked if u.check == telemetry_gaps.ID]
    assert gap, text
    assert any(r.startswith(f'{S.TELEMETRY_ERRORS.name}{{where="aggregator"}} rose by ')
               for r in gap[0].reasons), text
    # every round was lost: no verdict counted, so no classifier could have found it
    assert report.evidence.rounds.total == 0, text


def test_truncated_restore_with_rounds_lost_through_prometheus(rounds_lost, prometheus):
    def judge(sc):
        prom = prometheus([sc.metrics_url])
        prom.wait_for(f"{S.TELEMETRY_ERRORS.name} > 0")
        prom.wait_for("count_over_time(kvscope_scheduler_steps_total[1m]) >= 3", timeout=30)
        end = time.time()
        return diagnose_prometheus(prom.url, end - 120, end, selector='{job="kvscope"}',
                                   thresholds=TH)

    _check(judged("truncated", judge, exporter_port=0, fault_hooks=True))


def test_truncated_restore_with_rounds_lost_scraped_live(rounds_lost):
    _check(judged("truncated",
                  lambda sc: diagnose_scrape([sc.metrics_url], interval=1.0, thresholds=TH),
                  exporter_port=0, fault_hooks=True))
