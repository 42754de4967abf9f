"""Every alert has a runbook, every runbook an alert, and runbook_url points at it."""

from __future__ import annotations

from pathlib import Path

import yaml

from kvscope.dashboards import artifacts as g
from kvscope.dashboards.config import DEFAULT
from kvscope.dashboards.rules import ALERT_NAMES

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = REPO / "docs" / "runbooks"


def _alerts() -> dict[str, dict]:
    doc = yaml.safe_load((g.GENERATED_DIR / g.RULES_FILE).read_text())
    return {r["alert"]: r for grp in doc["groups"] for r in grp["rules"] if "alert" in r}


def test_alerts_and_runbooks_match():
    alerts = set(_alerts())
    assert alerts == set(ALERT_NAMES)
    runbooks = {p.stem for p in RUNBOOKS.glob("*.md")}
    assert alerts - runbooks == set(), "alerts without a runbook"
    assert runbooks - alerts == set(), "runbooks without an alert"


def test_runbook_url_resolves_to_the_file():
    for name, rule in _alerts().items():
        url = rule["annotations"]["runbook_url"]
        assert url == DEFAULT.runbook_url(name)
        assert (REPO / url).is_file(), url


def test_runbooks_have_the_sections():
    for path in RUNBOOKS.glob("*.md"):
        text = path.read_text()
        assert text.startswith(f"# {path.stem}\n"), path
        for heading in ("## What it means", "## Confirm with kv-diagnose", "## What to do"):
            assert heading in text, (path.name, heading)
        assert "kv-diagnose --" in text, path
