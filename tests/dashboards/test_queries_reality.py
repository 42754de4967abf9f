"""Issue 4, "checked against reality": the dashboards and rules against a real vLLM on CPU.

Prometheus scrapes kvscope's standalone exporter while a real vLLM CPU scenario runs
(``kvscope.connector.scenarios``). Then every panel query and every rule expression goes
through the HTTP API: each must parse, name only contract series, and return data whenever
every series it selects exists. For the incident scenarios, the matching alert expression
must select something (the ``for:`` clause aside).
"""

from __future__ import annotations

import pytest
from kvscope.dashboards import rules as r

from tests.dashboards import live
from tests.support import querycheck as qc
from tests.support.prometheus import free_port, require_binaries, running_prometheus

pytest.importorskip("vllm")
scenarios = pytest.importorskip("kvscope.connector.scenarios")

pytestmark = [pytest.mark.prometheus, pytest.mark.vllm]

# Scenario -> alerts whose expression must return series at the end of it. Alerts with long
# windows (stale stats: 120 s, stores without restores: 30 min of stores) are not expected
# from a short run.
EXPECTED_ALERT_EXPRS: dict[str, tuple[str, ...]] = {
    "capacity-ceiling": (r.ALERT_CAPACITY_CEILING,),
    "stale-rows": (r.ALERT_CHECKSUM_MISMATCH,),
    "pending-at-idle": (r.ALERT_PENDING_AT_IDLE,),
}


@pytest.mark.parametrize("scenario", sorted(scenarios.SCENARIOS))
def test_queries_against_real_scenario(scenario, tmp_path):
    require_binaries("prometheus")
    port = free_port()
    rules = live.write_fast_rules(tmp_path / "rules")
    url = f"http://127.0.0.1:{port}/metrics"
    # Prometheus first, so it scrapes while the scenario runs (the target is down until then).
    with running_prometheus([url], [rules], workdir=tmp_path / "prom",
                            wait_targets=False) as prom:
        with scenarios.run_scenario(scenario, exporter_port=port) as sc:
            assert sc.metrics_url == url
            prom.wait_targets_up(1, timeout=60)
            live.wait_for_data(prom, timeout=120)

            assert live.exported_unknown_names(prom) == set()
            queries = live.committed_queries()
            problems = qc.check_live(prom, [q for q in queries if q.kind != "alert"])
            # alerts: parse and known names for all; data for the scenario's own alerts
            expected = set(EXPECTED_ALERT_EXPRS.get(scenario, ()))
            alerts = [q for q in queries if q.kind == "alert"]
            problems += qc.check_live(prom, [q for q in alerts if q.name not in expected])
            for q in alerts:
                if q.name in expected and not prom.query(qc.substitute(q.expr)):
                    problems.append(f"{scenario}: {q.name} selects nothing: {q.expr}")
            assert not problems, "\n".join(problems)
