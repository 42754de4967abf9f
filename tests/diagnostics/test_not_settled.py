"""Not settled at idle, judged against what the engine did: vLLM's real scheduler on CPU.

The not-settled-at-idle scenario runs with the test fault ``leak_blocks``
(kvscope/sim/faults.py): every finished request leaves its GPU blocks referenced in vLLM's
block pool. Its premise is the engine's own state (every request finished, vLLM holds
none, its pool's blocks still referenced: ``kvscope.sim.scenarios.gpu_blocks_held``), not
kvscope's gauges. kv-diagnose, scraping the live engine, must name not_settled_at_idle with
exactly the blocks the pool holds; on the healthy scenario, whose pool holds none, the same
check runs and finds nothing.
"""

from __future__ import annotations

import pytest

from kvscope.diagnostics import diagnose_scrape, format_text
from kvscope.diagnostics.classifiers import not_settled_at_idle
from tests.support.reproduced import judged

from .test_scenarios import TH

pytestmark = pytest.mark.vllm


def _judge(sc):
    return diagnose_scrape([sc.metrics_url], interval=1.0, thresholds=TH), dict(sc.facts)


def test_blocks_the_engine_holds_at_idle_are_named():
    pytest.importorskip("vllm")
    report, facts = judged("not-settled-at-idle", _judge, exporter_port=0)
    text = format_text(report)
    assert report.top.id == not_settled_at_idle.ID and report.exit_code == 1, text
    blocks = report.top.facts.blocks
    assert blocks is not None and blocks.total, text
    assert blocks.held == facts["gpu_blocks_held"] > 0, (facts, text)  # the pool's own count


def test_a_healthy_engine_settles_and_is_checked():
    pytest.importorskip("vllm")
    report, facts = judged("healthy", _judge, exporter_port=0)
    text = format_text(report)
    assert facts["gpu_blocks_held"] == 0, facts  # the engine's pool holds nothing at idle
    assert report.healthy and report.exit_code == 0, text
    assert not_settled_at_idle.CHECK in report.checked, text  # it ran: healthy means checked
    assert report.evidence.settling.idle_gpu_blocks.last == 0, text
