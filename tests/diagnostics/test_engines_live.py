"""Two real engines in one Prometheus window: one idles with a stuck store, one serves.

Engine A runs the pending-at-idle scenario (its premise, from the engine: the request
finished while the scheduler still has work, rank 1's unreported store). Engine B ran
the healthy scenario, then took a long request it is still running. Judged one engine
at a time (a selector on A's instance) the window is pending at idle; judged together
the sums say "something runs", and before the one-engine check that read HEALTHY. It
must not: several engines in one window are inconclusive (diagnostics/engines.py).
"""

from __future__ import annotations

import time

import pytest

from kvscope.diagnostics import diagnose_prometheus, engines, format_text
from kvscope.diagnostics.report import EXIT_INCONCLUSIVE
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
            return alone, both, instance_a

        return judged("pending-at-idle", judge, exporter_port=0)

    alone, both, instance_a = judged("healthy", with_b, exporter_port=0)
    assert alone.top.id == "pending_at_idle", format_text(alone)
    text = format_text(both)
    assert both.status == "inconclusive" and both.exit_code == EXIT_INCONCLUSIVE, text
    gap = [u for u in both.unchecked if u.check == engines.ID]
    assert gap and gap[0].reasons[0].startswith("2 engines in this window: "), text
    assert instance_a in gap[0].reasons[0], text
    assert "--selector that matches one of them, e.g. '{instance=\"127.0.0.1:" \
        in both.top.next_step, text
