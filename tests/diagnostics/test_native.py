"""kv-diagnose on a stock vLLM 0.33 or 0.34 (no kvscope): reduced evidence from vLLM's native
metrics.

The fixtures are real scrapes of vLLM 0.33's and 0.34's /metrics from CPU runs with the stock
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
# The releases whose stock /metrics are captured: every test reads each one's capture.
RELEASES = ("0.33.0", "0.34.0")
pytestmark = pytest.mark.parametrize("release", RELEASES)


def capture(release: str, name: str) -> Path:
    return NATIVE / f"vllm-{release}-{name}.prom"


def _facts(path: Path) -> dict:
    for line in path.read_text().splitlines()[:3]:
        if line.startswith("# engine facts: "):
            return json.loads(line.removeprefix("# engine facts: "))
    raise AssertionError(f"{path} has no engine facts line")




def _window(path: Path):
    """The capture as kv-diagnose's scrape source reads it (one scrape, lifetime totals)."""
    from kvscope.diagnostics.sources.scrape import scrape_window

    with serving(path) as url:
        return scrape_window([url], interval=0.05)


def _diagnose(path: Path, capsys) -> tuple[int, dict]:
    with serving(path) as url:
        code = main(["--scrape", url, "--interval", "0.05", "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_capacity_ceiling_suspected_on_stock_vllm(release, capsys):
    path = capture(release, "capacity-ceiling")
    facts = _facts(path)
    assert facts["restored_tokens"] == 0  # the engine restored nothing: the premise
    code, report = _diagnose(path, capsys)
    assert code == 1
    assert report["reduced_evidence"] is True
    top = report["verdicts"][0]
    assert top["id"] == "capacity_ceiling_suspected"
    assert "kvscope_rounds_at_row_ceiling_total" in top["would_add"]
    assert "ObservedOffloadingConnector" in top["next_step"]
    assert report["facts"]["primary_chunks"] == 6


def test_healthy_on_stock_vllm(release, capsys):
    path = capture(release, "healthy")
    facts = _facts(path)
    assert facts["same_output"] and facts["restored_tokens"] == 96
    code, report = _diagnose(path, capsys)
    assert code == 0
    assert [v["id"] for v in report["verdicts"]] == ["healthy"]
    assert report["reduced_evidence"] is True


def test_two_engines_summed_are_not_healthy(release, capsys):
    """A stock engine at its capacity ceiling (restored nothing) beside a healthy one that
    restored: summed, "something was restored" hid the ceiling and read healthy."""
    ceiling, ok = capture(release, "capacity-ceiling"), capture(release, "healthy")
    assert _facts(ceiling)["restored_tokens"] == 0 and _facts(ok)["restored_tokens"] == 96
    with serving(ceiling) as a, serving(ok) as b:
        code = main(["--scrape", a, b, "--interval", "0.05", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 3, report
    top = report["verdicts"][0]
    assert top["id"] == "inconclusive" and top["title"].startswith("2 engines in one window")
    assert "once per engine" in top["next_step"]


def test_pending_at_idle_suspected_from_a_stalled_tier(release, capsys):
    """Disk-tier reads block (tests/diagnostics/native/runs.py tier-stall): the client aborts
    the request that waits, the engine idles with the promotion in flight."""
    path = capture(release, "tier-stall")
    facts = _facts(path)
    assert facts["request_waited_20_steps"] and facts["request_aborted"]
    assert facts["block_files_made_fifos"] > 0
    code, report = _diagnose(path, capsys)
    assert code == 1
    assert [v["id"] for v in report["verdicts"]] == ["pending_at_idle_suspected"]
    top = report["verdicts"][0]
    assert (report["facts"]["active_promotions"], report["facts"]["active_cascades"]) == (1, 0)
    assert "kvscope_pending_transfers" in top["would_add"]


def test_tier_job_failures_from_a_broken_disk_tier(release, capsys):
    """Block files truncated (promotions fail), then the tier's directory replaced by a file
    (cascades fail); the engine recomputed, same output, nothing restored."""
    path = capture(release, "tier-failures")
    facts = _facts(path)
    assert facts["files_truncated"] > 0 and facts["fs_root_replaced_by_file"]
    assert facts["same_output"] and facts["restored_tokens"] == 0
    code, report = _diagnose(path, capsys)
    assert code == 1
    assert [v["id"] for v in report["verdicts"]] == ["tier_job_failures"]
    seen = report["facts"]
    assert seen["promotion_job_failures"] > 0 and seen["cascade_job_failures"] > 0


def test_stores_without_restores_suspected_after_a_restart(release, capsys):
    """Four prompts on disk, a restart with another PYTHONHASHSEED, the four re-asked: the
    engine restored nothing although the disk held them."""
    path = capture(release, "restart-without-seed")
    facts = _facts(path)
    assert facts["disk_files_before_restart"] > 0
    assert facts["restored_tokens"] == [0] * facts["prompts_reasked"]
    code, report = _diagnose(path, capsys)
    assert code == 1
    assert [v["id"] for v in report["verdicts"]] == ["stores_without_restores_suspected"]
    top = report["verdicts"][0]
    assert "PYTHONHASHSEED" in top["next_step"] and "hash_seed" in top["would_add"]


def test_store_never_fits_suspected(release, capsys):
    """The store-never-fits scenario (one step's store job larger than the primary tier),
    stock connector: nothing reached the disk, nothing was restored."""
    path = capture(release, "store-never-fits")
    facts = _facts(path)
    assert facts["disk_block_files"] == 0 and facts["restored_tokens"] == 0
    code, report = _diagnose(path, capsys)
    assert code == 1
    assert [v["id"] for v in report["verdicts"]] == ["store_never_fits_suspected"]
    assert "no_space" in report["verdicts"][0]["would_add"]


def test_inconclusive_where_vllm_cannot_see_the_incident(release, capsys):
    """A GPU->CPU store that never completes (the pending-at-idle scenario, stock connector):
    vLLM's metrics show one short request and nothing restored, as any fresh engine does.
    kv-diagnose says it cannot tell (exit 3), not healthy and not a made-up class."""
    path = capture(release, "pending-at-idle")
    facts = _facts(path)
    assert facts["request_done"] and facts["has_pending_work"]  # the stuck store, per the engine
    code, report = _diagnose(path, capsys)
    assert code == 3
    assert [v["id"] for v in report["verdicts"]] == ["inconclusive"]
    # too little traffic to tell (not several engines summed): nothing restored, one engine
    seen = report["facts"]
    assert seen["restored_bytes"] == 0 and seen["external_hits"] == 0, seen
    assert len(seen["engines"]) == 1, seen


def test_queue_wait_suspected_when_requests_wait_for_the_scheduler(release, capsys):
    """More prompts than the GPU KV cache holds, none held by any tier (native/runs.py
    queue-wait): vLLM's queues hold waiting requests, none of them waiting on a KV load."""
    path = capture(release, "queue-wait")
    facts = _facts(path)
    assert facts["waiting"] > 0 and facts["waiting_for_kv"] == 0  # the premise, per vLLM
    code, report = _diagnose(path, capsys)
    assert code == 1
    top = report["verdicts"][0]
    assert top["id"] == "queue_wait_suspected"
    seen = report["facts"]
    assert seen["requests_waiting"] == facts["waiting"]
    assert seen["kv_fetch_by_stage"].get("in_progress", 0) == 0


def test_no_queue_wait_while_a_request_waits_on_its_kv_load(release):
    """The same waiting queue with one request in an async KV load is the load path's."""
    facts = native.collect(_window(capture(release, "queue-wait")))
    assert any(f.id == "queue_wait_suspected" for f in native.classify(facts))
    facts.kv_fetch_by_stage["in_progress"] = 1.0
    assert not any(f.id == "queue_wait_suspected" for f in native.classify(facts))


def test_text_report_says_reduced_evidence(release, capsys):
    with serving(capture(release, "capacity-ceiling")) as url:
        assert main(["--scrape", url, "--interval", "0.05"]) == 1
    text = capsys.readouterr().out
    assert native.REDUCED in text
    assert "Suspected capacity ceiling" in text and "kvscope would add:" in text


@pytest.mark.parametrize("name", ["capacity-ceiling", "healthy", "pending-at-idle",
                                  "restart-without-seed", "store-never-fits", "tier-failures",
                                  "tier-stall"])
def test_fixture_is_a_real_stock_vllm_scrape(release, name):
    text = (capture(release, name)).read_text()
    assert text.startswith(f"# kvscope capture: vLLM {release}, stock OffloadingConnector")
    assert "kvscope_" not in text  # no kvscope anywhere on that engine
    assert 'vllm:kv_offload_config_info{' in text
    assert "vllm:prompt_tokens_cached_by_source_total{" in text
