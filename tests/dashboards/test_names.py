"""Pure checks (no Prometheus): every name a panel or rule uses comes from the signal contract."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvscope.dashboards import artifacts as g
from kvscope.exporters import signals
from tests.support import querycheck as qc

GENERATED = {p.name: p.read_text() for p in sorted(g.GENERATED_DIR.iterdir())}
DASHBOARDS_SRC = Path(g.__file__).parent


def test_generated_files_present():
    assert set(GENERATED) == set(g.render())


def test_every_kvscope_name_in_generated_files_is_exported():
    text = "\n".join(GENERATED.values())
    names = qc.kvscope_names(text)
    assert names, "no kvscope_* names found at all: the regex or the files are broken"
    unknown = sorted(n for n in names if n not in qc.KNOWN_SERIES)
    assert not unknown, f"not in signals.ALL_METRICS: {unknown}"


@pytest.mark.parametrize("query", g.queries_from(GENERATED), ids=lambda q: f"{q.source}:{q.name}")
def test_query_names_are_known(query):
    assert not qc.unknown_names(query.expr)


def test_every_rule_and_panel_reads_some_contract_metric():
    for q in g.queries_from(GENERATED):
        assert qc.kvscope_names(q.expr) or qc.VLLM_NAME.search(q.expr) or \
            qc.RECORDED_NAME.search(q.expr), q


def test_detector_catches_unknown_names():
    assert qc.unknown_names("rate(kvscope_made_up_total[5m])") == {"kvscope_made_up_total"}
    assert qc.unknown_names("vllm:not_a_metric") == {"vllm:not_a_metric"}
    assert qc.unknown_names("x:kvscope_made_up:rate5m") == set()  # recorded, not exported
    assert qc.unknown_names(f"{signals.TRANSFER_SECONDS.name}_bucket") == set()


def test_dashboard_sources_do_not_respell_metric_names():
    """Names come from kvscope.exporters.signals; never as string literals in dashboards/."""
    pattern = re.compile(r"""["'](kvscope_[a-z_]+|vllm:[a-z_:]+)""")
    for path in DASHBOARDS_SRC.glob("*.py"):
        hits = pattern.findall(path.read_text())
        assert not hits, f"{path.name} spells metric names literally: {hits}"


def test_scope_narrows_series_selectors_only():
    within = 'instance="h:1"'
    expr = ('max by (instance, kvscope_version) (kvscope_info{model_name=~".*"})'
            ' * on (job) group_left sum(vllm:num_requests_running)'
            ' and job_instance:kvscope_lookups:rate5m > 0 and on (job) up == 1'
            ' unless kvscope_hit_tokens_total offset 5m')
    assert qc.scope(expr, within) == (
        'max by (instance, kvscope_version) (kvscope_info{instance="h:1",model_name=~".*"})'
        ' * on (job) group_left sum(vllm:num_requests_running{instance="h:1"})'
        ' and job_instance:kvscope_lookups:rate5m{instance="h:1"} > 0'
        ' and on (job) up{instance="h:1"} == 1'
        ' unless kvscope_hit_tokens_total{instance="h:1"} offset 5m')
    assert qc.substitute('x{model_name=~"$model"}', model="/m/a.b") == r'x{model_name=~"/m/a\\.b"}'
