"""The committed dashboards/rules equal a fresh render, and the CLI writes/checks them."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard

from kvscope.dashboards import artifacts as g
from kvscope.dashboards import cli
from kvscope.dashboards.config import DEFAULT, Config
from tests.support.querycheck import selectors


def test_committed_files_are_up_to_date():
    problems = g.check(g.GENERATED_DIR)
    assert not problems, (
        "dashboards/generated/ is stale; regenerate with `kvscope dashboards && kvscope rules` "
        "(or python -m kvscope.dashboards.cli ...):\n" + "\n".join(problems))


def test_generate_then_check_roundtrip(tmp_path):
    written = g.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(g.render())
    assert g.check(tmp_path) == []
    (tmp_path / g.RULES_FILE).write_text("groups: []\n")
    (tmp_path / g.OVERVIEW_FILE).unlink()
    problems = g.check(tmp_path)
    assert len(problems) == 2
    assert any("missing" in p for p in problems)


def test_render_is_deterministic():
    assert g.render() == g.render()


@pytest.mark.parametrize("name", [g.OVERVIEW_FILE, g.INCIDENT_FILE])
def test_dashboard_json_shape(name):
    dash = json.loads((g.GENERATED_DIR / name).read_text())
    # Grafana 11.6 schema (the pinned grafana-foundation-sdk build)
    assert dash["schemaVersion"] == 41
    assert dash["uid"] in (DEFAULT.overview_uid, DEFAULT.incident_uid)
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "model", "engine", "rank"]
    for var in dash["templating"]["list"][1:]:
        assert var["includeAll"] and var["allValue"] == ".*"
    panels = [p for p in g._panels(dash) if p["type"] != "row"]
    ids = [p["id"] for p in g._panels(dash)]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["description"], panel["title"]
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
    # the models round-trip through the SDK
    assert Dashboard.from_json(dash) is not None


def test_rules_shape():
    doc = yaml.safe_load((g.GENERATED_DIR / g.RULES_FILE).read_text())
    records = [r for grp in doc["groups"] for r in grp["rules"] if "record" in r]
    alerts = [r for grp in doc["groups"] for r in grp["rules"] if "alert" in r]
    assert records and alerts
    for r in records:
        level, metric, ops = r["record"].split(":")  # level:metric:operations
        assert level and metric.startswith("kvscope_") and ops
    for a in alerts:
        assert a["alert"].startswith("KVOffload")
        assert set(a["labels"]) == {"severity"}
        assert set(a["annotations"]) == {"summary", "description", "runbook_url"}
        assert "{{" not in a["annotations"]["summary"]
        assert "{{" in a["annotations"]["description"]


def test_config_selector_reaches_every_kvscope_selector():
    cfg = dataclasses.replace(DEFAULT, selector='job="vllm"')
    for q in g.queries(cfg):
        for sel in selectors(q.expr):
            # recorded series (level:kvscope_...:op) inherit the selector from their rule
            if sel.startswith("kvscope_"):
                assert 'job="vllm"' in sel, (q.name, sel)


@pytest.mark.parametrize("bad", [{"rate_window": "5 minutes"}, {"selector": '{job="x"}'},
                                 {"runbook_path_pattern": "docs/x.md"}, {"engine_labels": ()}])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        dataclasses.replace(Config(), **bad)


def test_runbook_url_pattern():
    cfg = dataclasses.replace(DEFAULT, runbook_base_url="https://example.org/kvscope/blob/v1/")
    assert cfg.runbook_url("KVOffloadX") == \
        "https://example.org/kvscope/blob/v1/docs/runbooks/KVOffloadX.md"


def test_cli_writes_checks_and_provisions(tmp_path, capsys):
    out = tmp_path / "out"
    provider = tmp_path / "provisioning" / "kvscope.yaml"
    assert cli.main(["dashboards", "--out", str(out), "--provider", str(provider)]) == 0
    assert cli.main(["rules", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(g.render())
    prov = yaml.safe_load(provider.read_text())
    assert prov["providers"][0]["options"]["path"] == str(out.resolve())
    assert cli.main(["dashboards", "--out", str(out), "--check"]) == 0
    assert cli.main(["rules", "--out", str(out), "--check", "--selector", 'job="vllm"']) == 1
    assert cli.main(["rules", "--out", str(out), "--selector", 'job="vllm"']) == 0
    assert 'kvscope_hit_tokens_total{job="vllm"}' in (out / g.RULES_FILE).read_text()


def test_add_subcommands_sets_handlers():
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_subcommands(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["dashboards"]).func is cli.cmd_dashboards
    assert parser.parse_args(["rules", "--out", "x"]).func is cli.cmd_rules
