"""An EAGLE drafter's sliding-window group on vLLM's scheduler on CPU: the veto on the release
that has it, none on the releases that fixed it, and kv-diagnose naming the cause only where
the engine vetoed.

The scenario (``drafter-group``) stores a prompt, floods it to disk and asks it again on a
model with a full-attention group of 32-token blocks beside an EAGLE drafter's group of
16-token blocks with a 16-token window. What vLLM did (tokens restored, output, the block
files per group on disk) decides what kv-diagnose must say; the release decides what vLLM
must have done (``known_bugs.EAGLE_NEVER_CERTIFIES``: 0.26 vetoes, 0.27 on restore).
"""

from __future__ import annotations

import pytest

from kvscope.diagnostics import Thresholds, diagnose_scrape, format_text
from kvscope.diagnostics import known_bugs as kb
from kvscope.exporters import signals as S

TH = Thresholds(pending_after_s=2.0)


def _vllm_version() -> str:
    vllm = pytest.importorskip("vllm")
    return vllm.__version__


def _run() -> tuple[object, dict]:
    from kvscope.sim.scenarios import run_scenario

    with run_scenario("drafter-group", exporter_port=0) as sc:
        facts = {k: v for k, v in sc.facts.items() if k not in ("first_output", "again_output")}
        return diagnose_scrape([sc.metrics_url], interval=1.0, thresholds=TH), facts


@pytest.mark.vllm
def test_the_veto_follows_the_release_and_the_verdict_follows_the_engine():
    version = _vllm_version()
    report, facts = _run()
    text = format_text(report)
    ids = {v.id for v in report.verdicts}
    ev = report.evidence
    # every release: both groups reached disk, the output is the same
    assert facts["same_output"], facts
    # the drafter's sliding-window group: where a promotion the window scan started counts
    # toward the window (0.33+), a restore promotes its window, a partial last chunk and the
    # chunk vLLM looks up beyond for the drafter; on 0.26 every chunk (0)
    from kvscope.sim.scenarios import DRAFTER_BLOCKS, DRAFTER_WINDOW

    window = -(-DRAFTER_WINDOW // DRAFTER_BLOCKS[1]) + 2
    assert ev.kv_group_restore_chunks == {"0": 0, "1": 0 if version.startswith("0.26.")
                                          else window}, text
    assert all(n > 0 for n in facts["disk_files"]), facts
    if kb.EAGLE_NEVER_CERTIFIES.affects(version):
        # vLLM vetoed the restore: nothing restored, the drafter group keyed with its tail dropped
        assert facts["restored_tokens"] == 0 and not facts["lookahead_hashes"], facts
        assert ev.kv_group_drafters == {"0": S.DrafterKeys.NONE.value,
                                        "1": S.DrafterKeys.TAIL_DROPPED.value}, text
        assert report.top.id == "known_vllm_bug", text
        assert kb.EAGLE_NEVER_CERTIFIES.id in report.top.title, text
        assert f"upgrade vLLM to {kb.EAGLE_NEVER_CERTIFIES.fixed_in}" in report.top.next_step, text
        # the veto is explained: no unclassified anomaly beside it
        assert "unclassified_anomaly" not in ids, text
    else:
        # a release that fixed it: the re-ask restored most of the prompt, and healthy
        assert facts["restored_tokens"] >= 224, facts
        assert report.top.id == "healthy", text
        assert "known_vllm_bug" not in ids, text
        lookahead = facts["lookahead_hashes"]
        assert ev.kv_group_drafters["1"] == (S.DrafterKeys.LOOKAHEAD.value if lookahead
                                             else S.DrafterKeys.TAIL_DROPPED.value), text


@pytest.mark.vllm
def test_without_the_drafter_the_same_model_restores():
    """The control: the veto is the drafter's (the same geometry, no drafter, restores)."""
    _vllm_version()
    from kvscope.sim.cpu_engine import EngineConfig
    from kvscope.sim.scenario_run import ScenarioRun
    from kvscope.sim.scenarios import drafter_group

    run = ScenarioRun("drafter-group-control", "", [])
    try:
        drafter_group(run, EngineConfig(), drafter=False)
    finally:
        for e in run.engines:
            e.close()
    assert run.facts["same_output"] and not run.facts["lookahead_hashes"], run.facts
    assert run.facts["restored_tokens"] >= 224, run.facts
