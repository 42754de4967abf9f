"""Two real engines in one Prometheus window: one idles with a stuck store, one serves.

Engine A runs the pending-at-idle scenario (its premise, from the engine: the request
finished while the scheduler still has work, rank 1's unreported store). Engine B ran
the healthy scenario, then took a long request it is still running. Judged one engine
at a time (a selector on A's instance) the window is pending at idle; judged together
the sums say "something runs", and before the one-engine check that read HEALTHY. It
must not: several engines in one window are inconclusive (diagnostics/verdict/one_engine.py).
"""

from __future__ import annotations

import time

import pytest

from kvscope.diagnostics import diagnose_prometheus, format_text
from kvscope.diagnostics.report.diagnosis import EXIT_INCIDENT, EXIT_INCONCLUSIVE
from kvscope.diagnostics.sources.prometheus import prometheus_window
from kvscope.diagnostics.verdict import one_engine, per_engine
from kvscope.exporters import signals as S
from tests.support.reproduced import judged

from .test_scenarios import STUCK_AFTER_S, TH

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus]

LONG_PROMPT = list(range(1000, 1032))


def _serving(b) -> None:
    """Engine B takes a long request and runs it a few steps (left running)."""
    e = b.engine
    rid = e.add_request(LONG_PROMPT, 100_000)
    for _ in range(3):
        e.step()
    e.refresh()
    assert rid not in e.finished and e.scheduler.has_requests()  # engine truth: it serves


def test_a_stuck_idle_engine_beside_a_serving_one(prometheus):
    pytest.importorskip("vllm")

    def with_b(b):
        _serving(b)

        def judge(a):
            prom = prometheus([a.metrics_url, b.metrics_url])
            prom.wait_for("count(kvscope_scheduler_steps_total) == 2")
            prom.wait_for("min(count_over_time(kvscope_scheduler_steps_total[1m])) >= 3",
                          timeout=30)
            prom.wait_for(f'max({S.OLDEST_PENDING_TRANSFER.name}{{kind="store"}}) > '
                          f"{STUCK_AFTER_S + 0.2}", timeout=30)
            end = time.time()
            instance_a = a.metrics_url.split("/")[2]
            alone = diagnose_prometheus(prom.url, end - 120, end,
                                        selector=f'{{job="kvscope",instance="{instance_a}"}}',
                                        thresholds=TH)
            both = diagnose_prometheus(prom.url, end - 120, end, selector='{job="kvscope"}',
                                       thresholds=TH)
            instance_b = b.metrics_url.split("/")[2]
            alone_b = diagnose_prometheus(prom.url, end - 120, end,
                                          selector=f'{{job="kvscope",instance="{instance_b}"}}',
                                          thresholds=TH)
            # --each-engine on the same window: cut per engine, each judged alone
            parts, why = per_engine.split(prometheus_window(prom.url, end - 120, end,
                                                             '{job="kvscope"}', 10.0))
            each = per_engine.diagnose_each(parts, TH)
            return alone, both, instance_a, (alone_b, instance_b, why, each)

        return judged("pending-at-idle", judge, exporter_port=0)

    alone, both, instance_a, (alone_b, instance_b, why, each) = judged("healthy", with_b,
                                                                       exporter_port=0)

    assert alone.top.id == "pending_at_idle", format_text(alone)
    text = format_text(both)
    assert both.status == "inconclusive" and both.exit_code == EXIT_INCONCLUSIVE, text
    gap = [u for u in both.unchecked if u.check == one_engine.ID]
    assert gap and gap[0].reasons[0].startswith("2 engines in this window: "), text
    assert instance_a in gap[0].reasons[0], text
    assert "--selector that matches one of them, e.g. '{instance=\"127.0.0.1:" \
        in both.top.next_step, text
    # --each-engine: each engine gets the verdict it gets when asked alone (a selector
    # on its instance): A's pending at idle, its premise from the engine above
    text = per_engine.format_each(each)
    assert why == "" and [v.engine.split(" ")[0] for v in each] == sorted(
        [instance_a, instance_b]), (why, text)
    got = {v.engine.split(" ")[0]: v.report for v in each}
    assert [f.id for f in got[instance_a].verdicts] == [f.id for f in alone.verdicts], text
    assert got[instance_b].status == alone_b.status, (format_text(alone_b), text)
    assert per_engine.exit_code(each) == EXIT_INCIDENT, text

