"""The soak's verdict (kvscope.sim.soak_report) on synthetic samples: what warm-up and
growth mean, and that each check fails the run when its invariant breaks."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest

from kvscope.sim import soak_report


def _sample(t_s: float, rss_kib: int, kind: str = "sample", errors: int = 0) -> dict:
    return {"kind": kind, "t_s": t_s, "rss_kib": rss_kib, "rss_anon_kib": rss_kib // 2,
            "journal_len": 0, "journal_len_max": 10, "series": 100, "telemetry_errors": errors,
            "pending_nonzero": {}, "kvscope_state_items": 50}


def test_growth_counts_from_the_first_sample_after_warm_up():
    # 10 samples, 10 % warm-up: sample 0 is warm-up (its 500 MiB never counts), sample 1 the
    # baseline, the largest after it the growth
    rss = [500_000, 1_000_000, 1_010_000, 1_040_000, 1_020_000] + [1_020_000] * 5
    got = soak_report.rss_growth([_sample(60 * i, r) for i, r in enumerate(rss)], 0.1)
    assert got["warmup_samples"] == 1 and got["baseline_kib"] == 1_000_000
    assert got["growth"] == pytest.approx(0.04)
    assert got["growth_last"] == pytest.approx(0.02)
    # 30 %: three warm-up samples, the baseline is the fourth
    got = soak_report.rss_growth([_sample(60 * i, r) for i, r in enumerate(rss)], 0.3)
    assert got["baseline_kib"] == 1_040_000 and got["growth"] == pytest.approx(0.0)


def test_steady_growth_shows_in_the_slope():
    got = soak_report.rss_growth([_sample(60 * i, 1_000_000 + 1_000 * i) for i in range(20)],
                                 0.1)
    assert got["slope_kib_per_min"] == pytest.approx(1_000)


def test_too_few_samples_after_warm_up_is_no_verdict():
    assert soak_report.rss_growth([_sample(0, 1), _sample(60, 1)], 0.1)["growth"] is None


def _finish(tmp_path, samples, tally=None, **summary) -> dict:
    out = soak_report.Output(str(tmp_path / "soak"))
    for s in samples:
        out.write(s)
    out.close()
    if tally is None:
        tally = soak_report.Tally()
        for cycle in range(2):
            tally.add({"cycle": cycle, "phase": "ceiling", "form": "alone", "cut": True,
                       "restored_tokens": [16], "ok": True})
    base = {"pending_after_drain": {}, "telemetry_errors_after_drain": {},
            "engine_after_drain": {"has_requests": False, "requests": 0},
            "scrapes": {"failed": 0}}
    args = Namespace(warmup_fraction=0.1, max_rss_growth=0.05, no_plot=True)
    return soak_report.finish({**base, **summary}, tally, out, args)


def _flat(n: int = 10, **final) -> list[dict]:
    return [_sample(60 * i, 1_000_000) for i in range(n)] + [
        _sample(60 * n, 1_000_000, kind="final", **final)]


def test_a_flat_clean_run_passes_and_is_written(tmp_path):
    got = _finish(tmp_path, _flat())
    assert got["ok"] and all(got["checks"].values())
    assert json.loads((tmp_path / "soak.json").read_text())["ok"] is True
    assert len((tmp_path / "soak.jsonl").read_text().splitlines()) == 11


@pytest.mark.parametrize(("breaks", "check"), [
    ("growth", "rss_growth"), ("error", "telemetry_errors_0"),
    ("error_after_drain", "telemetry_errors_0"), ("pending", "pending_0_after_drain"),
    ("requests_left", "pending_0_after_drain"), ("truth", "engine_truth"),
    ("scrape", "scrapes_ok"), ("traffic_error", "traffic_ran"),
    ("no_final", "pending_0_after_drain")])
def test_each_broken_invariant_fails_the_run(tmp_path, breaks, check):
    samples, summary, tally = _flat(), {}, None
    if breaks == "growth":
        samples[-1]["rss_kib"] = 1_050_000  # exactly the bound: not under it
    elif breaks == "error":
        samples[5]["telemetry_errors"] = 1
    elif breaks == "error_after_drain":
        summary["telemetry_errors_after_drain"] = {"aggregator": 1.0}
    elif breaks == "pending":
        summary["pending_after_drain"] = {"kvscope_pending_transfers,kind=promotion": 1.0}
    elif breaks == "requests_left":
        summary["engine_after_drain"] = {"has_requests": True, "requests": 1}
    elif breaks == "truth":
        tally = soak_report.Tally()
        for cycle in range(2):
            tally.add({"cycle": cycle, "phase": "ceiling", "form": "alone", "cut": True,
                       "restored_tokens": [16], "ok": cycle == 0})
    elif breaks == "scrape":
        summary["scrapes"] = {"failed": 1}
    elif breaks == "traffic_error":
        summary["traffic_error"] = "TimeoutError"
    elif breaks == "no_final":
        samples = samples[:-1]
    got = _finish(tmp_path, samples, tally, **summary)
    assert not got["ok"] and not got["checks"][check], got["checks"]
    if breaks != "no_final":  # no final sample: neither errors nor pending can be read
        assert sum(not v for v in got["checks"].values()) == 1, got["checks"]
