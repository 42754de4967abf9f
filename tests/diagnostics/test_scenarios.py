"""Every verdict from a real run: the vLLM CPU scenarios, scraped live and through a
real Prometheus, and the bundles recorded from them (fixtures, no vLLM needed).

Record fresh fixtures from real runs:
    KVSCOPE_RECORD_FIXTURES=1 pytest tests/diagnostics/test_scenarios.py -m vllm
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kvscope.diagnostics import diagnose_bundle, diagnose_prometheus, diagnose_scrape, format_text
from kvscope.diagnostics.bundle import write_bundle
from kvscope.diagnostics.scrape import scrape_window

FIXTURES = Path(__file__).parent / "fixtures"

# scenario -> the verdict that must rank first
EXPECTED = {
    "healthy": "healthy",
    "capacity-ceiling": "capacity_ceiling_veto",
    "livelock": "capacity_ceiling_livelock",
    "stale-rows": "stale_row_corruption",
    "pending-at-idle": "pending_at_idle",
    "queue-wait": "queue_wait",
    "store-never-fits": "store_never_fits",
    "stores-without-restores": "stores_without_restores",
}


def _runner():
    pytest.importorskip("vllm")
    mod = pytest.importorskip("kvscope.connector.scenarios")
    return mod.run_scenario


def _free_port() -> int:
    from tests.support.prometheus import free_port

    return free_port()


def _assert_top(report, expected):
    assert report.top.id == expected, format_text(report)
    assert report.exit_code == (0 if expected == "healthy" else 1)
    if expected == "queue_wait":  # never reported as a restore failure
        assert not {v.id for v in report.verdicts} & {
            "capacity_ceiling_veto", "capacity_ceiling_livelock", "stale_row_corruption",
        }, format_text(report)


@pytest.mark.vllm
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_scenario_scraped_live(name):
    run_scenario = _runner()
    with run_scenario(name, exporter_port=_free_port()) as sc:
        if os.environ.get("KVSCOPE_RECORD_FIXTURES"):
            FIXTURES.mkdir(exist_ok=True)
            write_bundle(scrape_window([sc.metrics_url], 1.0), str(FIXTURES / f"{name}.kvb"))
        report = diagnose_scrape([sc.metrics_url], interval=1.0)
    _assert_top(report, EXPECTED[name])


@pytest.mark.vllm
@pytest.mark.prometheus
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_scenario_through_prometheus(name, prometheus):
    run_scenario = _runner()
    with run_scenario(name, exporter_port=_free_port()) as sc:
        prom = prometheus([sc.metrics_url])
        prom.wait_for("kvscope_scheduler_steps_total")
        # two scrapes at least, so rates and "recent" exist
        prom.wait_for("count_over_time(kvscope_scheduler_steps_total[1m]) >= 3", timeout=30)
        end = time.time()
        report = diagnose_prometheus(prom.url, end - 120, end, selector='{job="kvscope"}')
    _assert_top(report, EXPECTED[name])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_bundle(name):
    path = FIXTURES / f"{name}.kvb"
    if not path.exists():
        pytest.skip(f"{path.name} not recorded yet (KVSCOPE_RECORD_FIXTURES=1 with vLLM)")
    _assert_top(diagnose_bundle(str(path)), EXPECTED[name])
