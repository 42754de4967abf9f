"""Whole ranks and whole series dropped from an incident (an endpoint not scraped, a relabel
rule, a federation filter): never healthy. Recorded real runs: the TP=2 scenario fixtures
(tests/diagnostics/fixtures/, kvscope_info{world_size="2"}) and the TP=2 GPU campaign
(tests/fixtures/campaign/, two H200s, recorded before the world_size label)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvscope.diagnostics import Thresholds
from kvscope.diagnostics.evidence.build import build_evidence
from kvscope.diagnostics.model import DiagnoseError, RawWindow, Series
from kvscope.diagnostics.sources.bundle import read_bundle
from kvscope.diagnostics.verdict import ranks
from kvscope.diagnostics.verdict.diagnose import diagnose
from kvscope.exporters import signals as S
from tests.support.openmetrics_window import read_samples, window

FIXTURES = Path(__file__).parent / "fixtures"
CAMPAIGN = Path(__file__).parents[1] / "fixtures" / "campaign"
# every recorded scenario but the healthy one (test_scenarios' thresholds: a CPU copy
# pending 2 s is stuck)
INCIDENTS = sorted(p.stem for p in FIXTURES.glob("*.kvb") if p.stem != "healthy")
TH = Thresholds(pending_after_s=2.0)
STALE = "stale_row_corruption"  # the rank-side check: per-rank checksums and refused loads
UNKNOWN = "world size unknown"


def _without(raw: RawWindow, keep) -> RawWindow:
    return dataclasses.replace(raw, series=tuple(s for s in raw.series if keep(s)))


def without_rank(raw: RawWindow, rank: str) -> RawWindow:
    """Every series of one rank gone, as when its endpoint is not scraped."""
    return _without(raw, lambda s: s.label(S.L_RANK) != rank)


def without_series(raw: RawWindow, name: str) -> RawWindow:
    return _without(raw, lambda s: s.name != name)


def rank_values(raw: RawWindow) -> list[str]:
    return sorted({v for s in raw.series for k, v in s.labels if k == S.L_RANK})


def series_names(raw: RawWindow) -> list[str]:
    return sorted({s.name for s in raw.series})


def _healthy_without(raw: RawWindow, drops, th: Thresholds) -> list[str]:
    """The drops after which ``raw`` reads as healthy (exit 0)."""
    out = []
    for what, stripped in drops:
        try:
            report = diagnose(build_evidence(stripped), th)
        except DiagnoseError:  # nothing of kvscope left: kv-diagnose refuses, no verdict
            continue
        if report.exit_code == 0:
            out.append(what)
    return out


def _fixture(name: str) -> RawWindow:
    raw = read_bundle(str(FIXTURES / f"{name}.kvb"))
    info = [s for s in raw.series if s.name == S.INFO.name]
    assert info and all(s.label(S.L_WORLD_SIZE) == "2" for s in info), name  # TP=2 runs
    return raw


@pytest.mark.parametrize("name", INCIDENTS)
def test_an_incident_missing_a_whole_rank_or_series_is_never_healthy(name):
    raw = _fixture(name)
    assert diagnose(build_evidence(raw), TH).exit_code == 1  # the incident, whole
    assert {"0", "1"} <= set(rank_values(raw))
    drops = [(f"rank {r}", without_rank(raw, r)) for r in rank_values(raw)]
    drops += [(f"series {n}", without_series(raw, n)) for n in series_names(raw)]
    assert len(drops) > 30
    healthy = _healthy_without(raw, drops, TH)
    assert not healthy, f"{name} called healthy without: {healthy}"


@pytest.mark.parametrize("name", ["healthy", *INCIDENTS])
def test_the_rank_side_check_never_passes_without_a_worker_rank(name):
    """Whatever else holds, the check that reads per-rank series says which rank it
    could not see, and never counts as a pass: a clean run too (the missing rank could
    have carried the mismatches)."""
    raw = _fixture(name)
    for r in ("0", "1"):
        report = diagnose(build_evidence(without_rank(raw, r)), TH)
        lines = [ln for u in report.unchecked if u.check == STALE for ln in u.reasons]
        assert any(ln.startswith(f"rank {r} missing from every worker-side series "
                                 f"({S.INFO.name} {S.L_WORLD_SIZE}=2; ranks seen: ")
                   for ln in lines), (name, r, lines)
        assert report.exit_code != 0, (name, r, report.top.id)
        if name == "healthy":
            assert report.status == "inconclusive", (r, report.top.id)


def test_the_mismatching_rank_dropped_is_inconclusive_not_healthy():
    # stale rows: every mismatch is on rank 1 (engine truth: rank 1 maps its own region)
    raw = _fixture("stale-rows")
    ev = build_evidence(raw)
    assert ev.worker_ranks["1"].checksum(S.ChecksumOutcome.MISMATCH).increase > 0
    assert ev.worker_ranks["0"].checksum(S.ChecksumOutcome.MISMATCH).increase == 0
    report = diagnose(build_evidence(without_rank(raw, "1")), TH)
    assert report.status == "inconclusive" and report.exit_code == 3, report.top.id
    (u,) = [u for u in report.unchecked if u.check == STALE]
    assert u.reasons == (f"rank 1 missing from every worker-side series ({S.INFO.name} "
                         f"{S.L_WORLD_SIZE}=2; ranks seen: 0): its endpoint not scraped, or its "
                         "series dropped by a relabel rule",)
    # the rank the check did see holds no mismatch: no finding, and no pass either
    assert STALE not in {v.id for v in report.verdicts}


def _without_world_size(raw: RawWindow) -> RawWindow:
    """The same run as a kvscope older than the label exported it."""
    return dataclasses.replace(raw, series=tuple(
        Series(s.name, tuple(kv for kv in s.labels if kv[0] != S.L_WORLD_SIZE), s.target,
               s.samples) if s.name == S.INFO.name else s for s in raw.series))


def test_without_the_world_size_the_report_says_it_cannot_tell():
    # A window from before the label: judged as before, and the report says what it cannot see
    raw = _without_world_size(_fixture("stale-rows"))
    report = diagnose(build_evidence(raw), TH)
    assert report.top.id == STALE and not report.unchecked
    assert any(n.startswith(UNKNOWN) and "2 worker ranks seen" in n for n in report.notes)
    whole = diagnose(build_evidence(_fixture("stale-rows")), TH)
    assert not any(n.startswith(UNKNOWN) for n in whole.notes)
    # a clean run from before the label: healthy, saying beside the ranks what it could not see
    report = diagnose(build_evidence(_without_world_size(_fixture("healthy"))), TH)
    assert report.status == "healthy", report.top.id
    assert (report.top.facts.reporting_ranks, report.top.facts.world_size) == (2, None)
    report = diagnose(build_evidence(_fixture("healthy")), TH)
    assert (report.top.facts.reporting_ranks, report.top.facts.world_size) == (2, 2)


def test_one_engines_rank_is_not_stood_in_for_by_anothers():
    """Two engines behind one vLLM /metrics (data parallel, ``engine`` label), each with
    ranks 0 and 1: engine 1's rank 1 gone is missing although engine 0's rank 1 is there."""
    raw = _fixture("queue-wait-vllm-metrics")  # vLLM's /metrics: every series engine="0"
    assert {s.label(S.VLLM_LABEL_ENGINE) for s in raw.series} == {"0"}
    twin = tuple(dataclasses.replace(s, labels=tuple(
        (k, "1" if k == S.VLLM_LABEL_ENGINE else v) for k, v in s.labels)) for s in raw.series)
    two = dataclasses.replace(raw, series=raw.series + twin)
    assert not ranks.missing(build_evidence(two))
    gone = _without(two, lambda s: not (s.label(S.VLLM_LABEL_ENGINE) == "1"
                                        and s.label(S.L_RANK) == "1"))
    report = diagnose(build_evidence(gone), TH)
    lines = [ln for u in report.unchecked if u.check == STALE for ln in u.reasons]
    assert len(lines) == 1 and lines[0].startswith("rank 1 missing from every worker-side series")
    assert "ranks seen: 0; engine 1 at " in lines[0], lines
    assert report.exit_code != 0


# ---- the TP=2 GPU campaign (two H200s, vllm serve), recorded before the label ------------
CAMPAIGN_RUNS = ("faults", "stale-rows-observe", "stale-rows-refuse")


def _campaign_incidents() -> list[tuple[str, dict]]:
    out = []
    for run in CAMPAIGN_RUNS:
        for phase in json.loads((CAMPAIGN / f"{run}.json").read_text())["phases"]:
            # the control is quiet; phases whose server died are not judged (docs/measured-facts.md)
            if "error" not in phase and phase["name"] != "control":
                out.append((run, phase))
    return out


PHASES = _campaign_incidents()


@pytest.mark.parametrize("run,phase", PHASES, ids=[f"{r}:{p['name']}" for r, p in PHASES])
def test_a_campaign_incident_missing_a_whole_rank_or_series_is_never_healthy(run, phase):
    raw = window(read_samples(CAMPAIGN / f"{run}.om.gz"), phase["start"], phase["end"], run)
    whole = diagnose(build_evidence(raw))
    assert whole.top.id == STALE, whole.top.id  # what the replay through Prometheus says
    assert {"0", "1", S.RANK_MANAGER} <= set(rank_values(raw))
    drops = [(f"rank {r}", without_rank(raw, r)) for r in rank_values(raw)]
    drops += [(f"series {n}", without_series(raw, n)) for n in series_names(raw)]
    healthy = _healthy_without(raw, drops, Thresholds())
    assert not healthy, f"{run}:{phase['name']} called healthy without: {healthy}"
    # Recorded before kvscope_info{world_size}: a rank gone from every series cannot be
    # seen, and the report says so (that no drop reads healthy here is owed to the checks
    # these recordings cannot run either: test_campaign_replay's ADDED_AFTER_RECORDING).
    report = diagnose(build_evidence(without_rank(raw, "1")))
    assert ranks.world_size(report.evidence) is None
    assert any(n.startswith(UNKNOWN) for n in report.notes), report.notes
