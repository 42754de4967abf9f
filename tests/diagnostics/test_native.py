"""kv-diagnose on a stock vLLM 0.33 (no kvscope): reduced evidence from vLLM's native metrics.

The fixtures are real scrapes of vLLM 0.33's /metrics from CPU runs with the stock
OffloadingConnector (``tests/diagnostics/native/capture.py``; the command is in its
docstring and the engine's facts are the first comment lines of each file). They are
served over loopback HTTP and diagnosed through the real CLI (``--scrape``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.diagnostics import native
from kvscope.diagnostics.cli import main
from tests.support.static_metrics import serving

NATIVE = Path(__file__).parent / "native"


def _facts(path: Path) -> dict:
    for line in path.read_text().splitlines()[:3]:
        if line.startswith("# engine facts: "):
            return json.loads(line.removeprefix("# engine facts: "))
    raise AssertionError(f"{path} has no engine facts line")




def _diagnose(path: Path, capsys) -> tuple[int, dict]:
    with serving(path) as url:
        code = main(["--scrape", url, "--interval", "0.05", "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_capacity_ceiling_suspected_on_stock_vllm(capsys):
    path = NATIVE / "vllm-0.33.0-capacity-ceiling.prom"
    facts = _facts(path)
    assert facts["restored_tokens"] == 0  # the engine restored nothing: the premise
    code, report = _diagnose(path, capsys)
    assert code == 1
    assert report["reduced_evidence"] is True
    top = report["verdicts"][0]
    assert top["id"] == "capacity_ceiling_suspected"
    assert "kvscope_rounds_at_row_ceiling_total" in top["would_add"]
    assert "ObservedOffloadingConnector" in top["next_step"]
    assert any("primary tier: 6 chunks" in e for e in top["evidence"])


def test_healthy_on_stock_vllm(capsys):
    path = NATIVE / "vllm-0.33.0-healthy.prom"
    facts = _facts(path)
    assert facts["same_output"] and facts["restored_tokens"] == 96
    code, report = _diagnose(path, capsys)
    assert code == 0
    assert [v["id"] for v in report["verdicts"]] == ["healthy"]
    assert report["reduced_evidence"] is True


def test_two_engines_summed_are_not_healthy(capsys):
    """A stock engine at its capacity ceiling (restored nothing) beside a healthy one that
    restored: summed, "something was restored" hid the ceiling and read healthy."""
    ceiling, ok = NATIVE / "vllm-0.33.0-capacity-ceiling.prom", NATIVE / "vllm-0.33.0-healthy.prom"
    assert _facts(ceiling)["restored_tokens"] == 0 and _facts(ok)["restored_tokens"] == 96
    with serving(ceiling) as a, serving(ok) as b:
        code = main(["--scrape", a, b, "--interval", "0.05", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 3, report
    top = report["verdicts"][0]
    assert top["id"] == "inconclusive" and top["title"].startswith("2 engines in one window")
    assert "once per engine" in top["next_step"]


def test_pending_at_idle_suspected_from_a_stalled_tier(capsys):
    """Disk-tier reads block (tests/diagnostics/native/runs.py tier-stall): the client aborts
    the request that waits, the engine idles with the promotion in flight."""
    path = NATIVE / "vllm-0.33.0-tier-stall.prom"
    facts = _facts(path)
    assert facts["request_waited_20_steps"] and facts["request_aborted"]
    assert facts["block_files_made_fifos"] > 0
    code, report = _diagnose(path, capsys)
    assert code == 1
    assert [v["id"] for v in report["verdicts"]] == ["pending_at_idle_suspected"]
    top = report["verdicts"][0]
    assert any("1 promotion and 0 cascade jobs active" in e for e in top["evidence"])
    assert "kvscope_pending_transfers" in top["would_add"]


def test_tier_job_failures_from_a_broken_disk_tier(capsys):
    """Block files truncated (promotions fail), then the tier's directory replaced by a file
    (cascades fail); the engine recomputed, same output, nothing restored."""
    path = NATIVE / "vllm-0.33.0-tier-failures.prom"
    facts = _facts(path)
    assert facts["files_truncated"] > 0 and facts["fs_root_replaced_by_file"]
    assert facts["same_output"] and facts["restored_tokens"] == 0
    code, report = _diagnose(path, capsys)
    assert code == 1
    assert [v["id"] for v in report["verdicts"]] == ["tier_job_failures"]
    failures = [e for e in report["verdicts"][0]["evidence"] if "job failures" in e]
    assert failures and "0 promotion" not in failures[0] and " 0 cascade" not in failures[0]


def test_stores_without_restores_suspected_after_a_restart(capsys):
    """Four prompts on disk, a restart with another PYTHONHASHSEED, the four re-asked: the
    engine restored nothing although the disk held them."""
    path = NATIVE / "vllm-0.33.0-restart-without-seed.prom"
    facts = _facts(path)
    assert facts["disk_files_before_restart"] > 0
    assert facts["restored_tokens"] == [0] * facts["prompts_reasked"]
    code, report = _diagnose(path, capsys)
    assert code == 1
    assert [v["id"] for v in report["verdicts"]] == ["stores_without_restores_suspected"]
    top = report["verdicts"][0]
    assert "PYTHONHASHSEED" in top["next_step"] and "hash_seed" in top["would_add"]


def test_store_never_fits_suspected(capsys):
    """The store-never-fits scenario (one step's store job larger than the primary tier),
    stock connector: nothing reached the disk, nothing was restored."""
    path = NATIVE / "vllm-0.33.0-store-never-fits.prom"
    facts = _facts(path)
    assert facts["disk_block_files"] == 0 and facts["restored_tokens"] == 0
    code, report = _diagnose(path, capsys)
    assert code == 1
    assert [v["id"] for v in report["verdicts"]] == ["store_never_fits_suspected"]
    assert "no_space" in report["verdicts"][0]["would_add"]


def test_inconclusive_where_vllm_cannot_see_the_incident(capsys):
    """A GPU->CPU store that never completes (the pending-at-idle scenario, stock connector):
    vLLM's metrics show one short request and nothing restored, as any fresh engine does.
    kv-diagnose says it cannot tell (exit 3), not healthy and not a made-up class."""
    path = NATIVE / "vllm-0.33.0-pending-at-idle.prom"
    facts = _facts(path)
    assert facts["request_done"] and facts["has_pending_work"]  # the stuck store, per the engine
    code, report = _diagnose(path, capsys)
    assert code == 3
    assert [v["id"] for v in report["verdicts"]] == ["inconclusive"]
    assert any("not in vLLM's metrics" in e for e in report["verdicts"][0]["evidence"])


def test_text_report_says_reduced_evidence(capsys):
    with serving(NATIVE / "vllm-0.33.0-capacity-ceiling.prom") as url:
        assert main(["--scrape", url, "--interval", "0.05"]) == 1
    text = capsys.readouterr().out
    assert native.REDUCED in text
    assert "Suspected capacity ceiling" in text and "kvscope would add:" in text


@pytest.mark.parametrize("name", ["capacity-ceiling", "healthy", "pending-at-idle",
                                  "restart-without-seed", "store-never-fits", "tier-failures",
                                  "tier-stall"])
def test_fixture_is_a_real_vllm_033_scrape(name):
    text = (NATIVE / f"vllm-0.33.0-{name}.prom").read_text()
    assert text.startswith("# kvscope capture: vLLM 0.33.0, stock OffloadingConnector")
    assert "kvscope_" not in text  # no kvscope anywhere on that engine
    assert 'vllm:kv_offload_config_info{' in text
    assert "vllm:prompt_tokens_cached_by_source_total{" in text
