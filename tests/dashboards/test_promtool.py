"""promtool: the generated rules pass `check rules --lint-fatal` and the unit tests in rules/."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kvscope.dashboards import artifacts as g
from kvscope.dashboards.rules import ALERT_NAMES

pytestmark = pytest.mark.prometheus

RULE_TESTS = Path(__file__).parent / "rules"
TEST_FILES = sorted(RULE_TESTS.glob("*.test.yaml"))


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def test_check_rules_lint_fatal():
    res = _promtool("check", "rules", "--lint-fatal", str(g.GENERATED_DIR / g.RULES_FILE))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests(path):
    # run from the test file's folder: rule_files are relative to it
    res = _promtool("test", "rules", path.name, cwd=RULE_TESTS)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    cases: dict[str, set[str]] = {name: set() for name in ALERT_NAMES}
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../../../dashboards/generated/kvscope-rules.yaml"], path
        for test in doc["tests"]:
            assert test.get("name"), f"{path.name}: every test group needs a name"
            for art in test.get("alert_rule_test", []):
                cases[art["alertname"]].add("fires" if art.get("exp_alerts") else "quiet")
    missing = {name: {"fires", "quiet"} - got for name, got in cases.items()
               if got != {"fires", "quiet"}}
    assert not missing, missing


def test_firing_cases_assert_every_annotation_verbatim():
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for art in test.get("alert_rule_test", []):
                for exp in art.get("exp_alerts") or []:
                    assert set(exp["exp_annotations"]) == {"summary", "description", "runbook_url"}
                    assert "severity" in exp["exp_labels"]
