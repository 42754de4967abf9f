"""kv-diagnose names a known vLLM bug by the running release, never on a release that fixed it.

The capture is a real scrape of kvscope's exporter from a CPU run on vLLM 0.26 that reached
the store-after-finish bug (``tests/diagnostics/known_bugs/capture.py``; the engine facts are
its first comment lines), served over loopback HTTP and diagnosed through the real CLI. The
hidden-style check: the very same scrape labelled with a fixed release gets another verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.diagnostics import known_bugs as kb
from kvscope.diagnostics.cli import main
from kvscope.exporters import signals as S
from tests.support.static_metrics import serve

CAPTURE = Path(__file__).parent / "known_bugs" / "vllm-0.26.0-store-after-finish.prom"
RECORDED = 'vllm_version="0.26.0"'


def _facts(text: str) -> dict:
    for line in text.splitlines()[:3]:
        if line.startswith("# engine facts: "):
            return json.loads(line.removeprefix("# engine facts: "))
    raise AssertionError("the capture has no engine facts line")


def _diagnose(text: str, capsys) -> tuple[int, dict]:
    with serve(lambda: text.encode()) as url:
        code = main(["--scrape", url, "--interval", "0.05", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_capture_is_the_bug_contained():
    text = CAPTURE.read_text()
    facts = _facts(text)
    # the premise, from engine truth: the request finished, the other's keys held and restored
    assert facts["vllm_version"] == "0.26.0" and facts["short_finished"]
    assert facts["holder_keys_held"] and facts["same_holder_output"]
    assert facts["holder_restored_tokens"] > 0
    assert RECORDED in text


def test_named_on_the_release_that_has_it_with_the_release_to_upgrade_to(capsys):
    code, report = _diagnose(CAPTURE.read_text(), capsys)
    assert code == 1
    verdicts = {v["id"]: v for v in report["verdicts"]}
    # the run's other stores never fit 4 rows (the way to the bug): that serving incident
    # ranks first, the release's bug beside it
    assert list(verdicts)[:2] == ["store_never_fits", "known_vllm_bug"]
    top = verdicts["known_vllm_bug"]
    assert "store_after_finish" in top["title"]
    assert "upgrade vLLM to 0.27.0 or later" in top["next_step"]
    assert "contain_vllm_faults" in top["next_step"]  # what to do until then
    (bug,) = top["facts"]["bugs"]
    assert (bug["id"], bug["since"], bug["fixed_in"]) == ("store_after_finish", "0.26.0", "0.27.0")
    assert [e["vllm_version"] for e in bug["engines"]] == ["0.26.0"]
    assert "#49635" in bug["upstream"]
    assert "unclassified_anomaly" not in [v["id"] for v in report["verdicts"]]


@pytest.mark.parametrize("fixed", ["0.27.0", "0.33.0", "0.34.0"])
def test_the_same_evidence_on_a_fixed_release_is_not_that_bug(fixed, capsys):
    code, report = _diagnose(CAPTURE.read_text().replace(RECORDED, f'vllm_version="{fixed}"'),
                             capsys)
    verdicts = {v["id"]: v for v in report["verdicts"]}
    assert "known_vllm_bug" not in verdicts
    # the count itself is inconsistent there (kvscope wraps nothing): an anomaly, never healthy
    assert code == 1 and "unclassified_anomaly" in verdicts
    (fault,) = verdicts["unclassified_anomaly"]["facts"]["stray_faults"]
    assert fault["fault"] == "store_after_finish" and fault["contained"] > 0
    assert fault["vllm_versions"] == [fixed] and fault["fixed_in"] == "0.27.0"


def test_without_the_release_the_bug_is_not_guessed(capsys):
    text = "\n".join(line for line in CAPTURE.read_text().splitlines()
                     if not line.startswith(S.INFO.name + "{")) + "\n"
    _, report = _diagnose(text, capsys)
    assert "known_vllm_bug" not in [v["id"] for v in report["verdicts"]]
    unchecked = {u["check"]: u["reasons"] for u in report["unchecked"]}
    assert unchecked["known_vllm_bug"] == [f"series {S.INFO.name} missing"]


@pytest.mark.parametrize("version,has", [
    ("0.26.0", True), ("0.26.1.dev3+gabc", True), ("0.27.0", False), ("0.33.0", False),
    ("0.34.0", False), ("0.25.1", False), ("", None), ("unknown", None)])
def test_store_after_finish_by_release(version, has):
    assert kb.STORE_AFTER_FINISH.affects(version) is has


def test_every_entry_says_what_was_checked_and_where_it_is_reproduced():
    for bug in kb.KNOWN_BUGS:
        assert bug.verified and bug.reproduced and bug.until_then and bug.upstream, bug.id
        assert kb.release(bug.since) is not None, bug.id
        if bug.fixed_in is not None:
            assert kb.release(bug.fixed_in) > kb.release(bug.since), bug.id
            assert not bug.affects(bug.fixed_in) and bug.affects(bug.since), bug.id
        # a bug kv-diagnose names has a rule; one without says which class names it or why not
        assert bug.evidence is not None or bug.named_by or "not reproduced" in bug.reproduced \
            or bug.evidence_rule == "" or bug.id == "cpu_usage_gauge_zero", bug.id
    assert len(kb.BY_ID) == len(kb.KNOWN_BUGS)
    assert set(kb.BY_ID) >= {f.value for f in S.VllmFault}  # every contained fault is listed


def test_the_usage_gauge_capture_reads_zero_while_restores_succeed():
    """cpu_usage_gauge_zero's recorded capture: vLLM's gauge 0.0, the engine's facts a
    restore of 96 tokens (vLLM's own load bytes say the same)."""
    path = Path(__file__).parent / "native" / "vllm-0.33.0-healthy.prom"
    text = path.read_text()
    assert _facts(text)["restored_tokens"] == 96
    assert path.name in kb.CPU_USAGE_GAUGE_ZERO.reproduced
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(("vllm:kv_offload_cpu_cache_usage_perc{",
                                  "vllm:kv_offload_load_bytes_total{"))}
    assert values["vllm:kv_offload_cpu_cache_usage_perc"] == 0.0
    assert values["vllm:kv_offload_load_bytes_total"] > 0


@pytest.mark.vllm
def test_a_live_run_on_a_release_with_the_bug_gets_the_same_verdict(capsys):
    pytest.importorskip("vllm")
    from kvscope.connector.compat import store_after_finish as bug

    if not bug.has_bug():
        pytest.skip("this vLLM has no store-after-finish bug: tests/connector covers it")
    from tests.diagnostics.known_bugs.capture import capture

    text, facts = capture()
    capsys.readouterr()  # vLLM's own log lines, printed while it ran
    assert facts["short_finished"] and facts["holder_keys_held"] and facts["same_holder_output"]
    code, report = _diagnose(text, capsys)
    assert code == 1 and "known_vllm_bug" in [v["id"] for v in report["verdicts"]]
