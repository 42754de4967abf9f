"""Every panel query and rule expression against a live Prometheus fed by the stand-in exporter.

Proves the query-check machinery and the PromQL itself (parses, selects contract series, returns
data where data exists) without vLLM. The same checks run against real vLLM scenarios in
test_queries_reality.py.
"""

from __future__ import annotations

import pytest

from kvscope.dashboards import artifacts as g
from kvscope.dashboards.rules import ALERT_NAMES
from tests.dashboards import live
from tests.support import querycheck as qc
from tests.support.fake_exporter import fake_exporter

pytestmark = pytest.mark.prometheus


@pytest.fixture(scope="module")
def fake(live_pool):
    """(prom, matchers selecting the stand-in exporter) in the shared Prometheus."""
    target = live_pool.claim("fake-exporter")
    with fake_exporter(port=target.port):
        live.wait_for_data(live_pool.prom, [target])
        yield live_pool.prom, target.within


@pytest.fixture
def prom(fake):
    return fake[0]


def test_rules_load_and_evaluate(prom):
    groups = {grp["name"]: grp for grp in prom.rules()}
    alerts = [r["name"] for r in groups["kvscope.alerts"]["rules"]]
    assert alerts == list(ALERT_NAMES)
    for grp in groups.values():
        for rule in grp["rules"]:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))


def test_stand_in_exports_only_contract_names(fake):
    prom, within = fake
    assert live.exported_unknown_names(prom, within) == set()


def test_every_query_parses_and_returns_data(fake):
    prom, within = fake
    queries = live.committed_queries()
    assert len([q for q in queries if q.kind == "panel"]) >= 30
    problems = qc.check_live(prom, queries, within=within)
    assert not problems, "\n".join(problems)


def test_every_recorded_series_exists(fake):
    prom, within = fake
    for q in live.committed_queries():
        if q.kind == "record":
            assert prom.query(qc.scope(q.name, within)), q.name


def test_scope_narrows_every_selector(prom):
    other = 'instance="127.0.0.1:1"'  # no target there
    for q in live.committed_queries():
        if q.kind in ("panel", "record", "alert"):
            result = prom.query(qc.scope(qc.substitute(q.expr), other))
            # only constants survive ("or vector(0)")
            assert all(not r["metric"] for r in result), (q.name, result)


def test_machinery_catches_bad_queries(fake):
    prom, _within = fake
    bad = [
        g.Query("t", "syntax", "sum(rate(kvscope_hit_tokens_total[5m])", "panel"),
        g.Query("t", "unknown", "rate(kvscope_made_up_total[5m])", "panel"),
        g.Query("t", "empty", f"{qc.s.HIT_TOKENS.name} < 0", "panel"),
    ]
    problems = qc.check_live(prom, bad)
    assert len(problems) == 3, problems
    assert "rejected by Prometheus" in problems[0]
    assert "not in the signal contract" in problems[1]
    assert "no series" in problems[2]
