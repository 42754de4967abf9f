"""The soak's short version: kvscope.sim.soak, the same code as the hour-long soak
benchmark, with its short preset for ~90 s of traffic, in a process of
its own (the RSS it samples is the soak's alone, not pytest's).

Judged from what the engine did, as each phase recorded it (vLLM's outputs and
``num_external_cached_tokens``, the tiers' own rows and files, vLLM's scheduler after the
drain), and from kvscope's endpoints for its errors and pending gauges.

The memory bound here is 1 %, not the hour's 5 %, and it means less: ~70 s after warm-up
can only show a gross leak (1 % is ~9.5 MiB of a ~950 MiB process in 70 s, a rate that
would be ~0.5 GiB in an hour); the hour-long run's 5 % over an hour is the real bound.
It is not looser than that because the short run's own growth with these settings measured
0.04 % on vLLM 0.26 and 0.33 (0.15-0.29 % with a 10 % warm-up; docs/measured-facts.md),
warm-up being the first 20 % of the samples (the first two cycles: both ceiling forms have
run once) instead of 10 %.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
TRAFFIC_S = 90
MAX_RSS_GROWTH = 0.01


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("soak")
    out = tmp / "soak"
    # the fs tier goes under pytest's temp dir, whatever file system CI gives it
    cmd = [sys.executable, "-m", "kvscope.sim.soak", "--preset", "short",
           "--duration-s", str(TRAFFIC_S), "--sample-interval-s", "8",
           "--scrape-interval-s", "5", "--warmup-fraction", "0.2",
           "--max-rss-growth", str(MAX_RSS_GROWTH), "--fs-dir", str(tmp), "--allow-tmpfs",
           "--no-plot", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=480, cwd=ROOT)
    summary_file = Path(str(out) + ".json")
    assert summary_file.exists(), proc.stderr[-4000:]
    records = [json.loads(line) for line in Path(str(out) + ".jsonl").read_text().splitlines()]
    return proc, json.loads(summary_file.read_text()), records


def _phases(records, name):
    return [r for r in records if r["kind"] == "phase" and r["phase"] == name]


def test_every_reask_restored_all_the_tiers_held(soak):
    _, _, records = soak
    reasks = _phases(records, "reask")
    assert len(reasks) >= 4
    for r in reasks:  # the whole prompt reached the fs tier and came back, unchanged
        assert r["held_tokens"] == r["prompt_tokens"], r
        assert r["restored_tokens"] == r["held_tokens"], r
        assert all(r["same_output"]), r


def test_the_ceiling_cut_restores_in_both_forms_and_outputs_stayed(soak):
    _, _, records = soak
    ceilings = _phases(records, "ceiling")
    assert {c["form"] for c in ceilings if c["cut"]} == {"alone", "concurrent"}
    for c in ceilings:
        assert all(c["same_output"]), c
        assert all(r <= h for r, h in zip(c["restored_tokens"], c["held_tokens"])), c


def test_floods_were_new_and_the_session_hit_the_gpu(soak):
    _, _, records = soak
    assert all(f["restored_tokens"] == 0 for f in _phases(records, "flood"))
    for s in _phases(records, "shared"):  # the later turns found the prefix on the GPU
        assert s["cached_tokens"][0] == 0 and min(s["cached_tokens"][1:]) >= 6 * 1024, s


def test_after_the_drain_nothing_is_pending_and_nothing_failed(soak):
    proc, summary, records = soak
    assert summary["engine_after_drain"] == {"has_requests": False, "requests": 0}
    assert summary["pending_after_drain"] == {}
    assert records[-1]["kind"] == "final" and records[-1]["pending_nonzero"] == {}
    samples = [r for r in records if r["kind"] in ("sample", "final")]
    assert all(s["telemetry_errors"] == 0 for s in samples)
    assert summary["telemetry_errors_after_drain"] == {}
    assert summary["scrapes"]["failed"] == 0 and summary["scrapes"]["done"] > 0
    assert proc.returncode == 0, (summary["checks"], proc.stderr[-4000:])


def test_rss_flat_after_warm_up(soak):
    _, summary, _ = soak
    rss = summary["rss"]
    assert rss["samples_after_warmup"] >= 5, rss
    assert rss["growth"] < MAX_RSS_GROWTH, rss
