"""Healthy means checked: missing or non-finite inputs, a failing check and the
invariants no class explains never read as healthy."""

from __future__ import annotations

import math

import pytest

from kvscope.diagnostics.model import RawWindow, Series
from kvscope.diagnostics.report.diagnosis import format_text
from kvscope.diagnostics.verdict.diagnose import diagnose
from kvscope.exporters import signals as S

from .support import T0, L, base, declared, evidence, window
from .test_classifiers import lookups, pending_case, rounds


def _drop(d: dict, name: str) -> dict:
    """``d`` (with the declared series made explicit) without any series of ``name``."""
    d = declared() | d
    return {k: v for k, v in d.items() if (k if isinstance(k, str) else k[0]) != name}


def _quiet():
    d = base() | rounds(hit=[10, 12], miss=[2, 2]) | lookups("0", hit=[60, 72])
    d[S.HIT_TOKENS.name] = [160, 192]
    return d


def test_quiet_engine_with_every_series_is_healthy():
    report = diagnose(evidence(_quiet()))
    assert report.status == "healthy" and report.exit_code == 0 and not report.unchecked


@pytest.mark.parametrize("metric,check", [
    (S.INFO, "stores_without_restores"),
    (S.OLDEST_PENDING_TRANSFER, "pending_at_idle"),
    (S.ROW_CHECKSUMS, "stale_row_corruption"),
    (S.LAST_STEP_TIMESTAMP, "stale_telemetry"),
    (S.IDLE_GPU_BLOCKS, "not_settled_at_idle"),  # kvscope_gpu_blocks is there: it was dropped
    (S.HOST_MEMORY_AVAILABLE, "not_settled_at_idle"),  # as the process's memory is
])
def test_a_missing_series_is_could_not_check_never_healthy(metric, check):
    report = diagnose(evidence(_drop(_quiet(), metric.name), declare=False))
    assert report.status == "inconclusive" and report.exit_code == 3
    [u] = [u for u in report.unchecked if u.check == check]
    assert f"series {metric.name} missing" in u.reasons
    text = format_text(report)
    assert "Verdict: INCONCLUSIVE" in text and f"could not check {check}" in text
    doc = report.to_dict()
    assert doc["status"] == "inconclusive" and doc["exit_code"] == 3
    assert {"check": check, "what": u.what, "reasons": list(u.reasons)} in doc["unchecked"]


def test_a_label_stripped_by_relabelling_is_could_not_check():
    d = _drop(_quiet(), S.ROUNDS_AT_ROW_CEILING.name) | {S.ROUNDS_AT_ROW_CEILING.name: [0, 0]}
    report = diagnose(evidence(d, declare=False))
    [u] = [u for u in report.unchecked if u.check == "capacity_ceiling_veto"]
    assert u.reasons == (f"series {S.ROUNDS_AT_ROW_CEILING.name} has no 'verdict' label",)
    assert report.exit_code == 3


def test_the_issue_case_is_an_anomaly_not_healthy():
    """No kvscope_info, no pending-age gauge, the ceiling counter without its label,
    4,760 of 4,760 rounds vetoed with 0 hits: was 'Healthy, Nothing to do'."""
    d = _drop(_drop(_drop(base(), S.INFO.name), S.OLDEST_PENDING_TRANSFER.name),
              S.ROUNDS_AT_ROW_CEILING.name)
    d |= rounds(vetoed=[0, 4760], hit=[0, 0], deferred=[0, 0], miss=[0, 0])
    d |= {S.ROUNDS_AT_ROW_CEILING.name: [0, 4760]} | lookups("0", retry=[0, 9520])
    report = diagnose(evidence(d, lifetime=False, declare=False))
    assert report.exit_code == 1
    assert report.top.id == "unclassified_anomaly"
    rf = report.top.facts.rounds_failing
    assert (rf.vetoed, rf.rounds, rf.lifetime, rf.mostly_vetoed) == (4760, 4760, False, True)
    unchecked = {u.check for u in report.unchecked}
    assert {"capacity_ceiling_veto", "stores_without_restores", "pending_at_idle"} <= unchecked
    assert "Could not check:" in format_text(report)


def test_a_load_pending_for_an_hour_without_its_age_gauge_is_an_anomaly():
    d = _drop(base(last_step=[T0, T0 + 3600]), S.OLDEST_PENDING_TRANSFER.name)
    d[L(S.PENDING_TRANSFERS.name, kind="load")] = [1] * 13
    d[S.REQUESTS_IN_FLIGHT.name] = [0] * 13
    report = diagnose(evidence(d, t1=T0 + 3600, lifetime=False, declare=False))
    assert report.exit_code == 1 and report.top.id == "unclassified_anomaly"
    # the age series missing: at least 60 min pending on an idle engine
    assert [(p.kind, p.pending_s) for p in report.top.facts.idle_pending] == [("load", 3600)]


def test_a_transfer_pending_far_longer_than_any_real_one_while_busy():
    d = pending_case()
    d[L(S.OLDEST_PENDING_TRANSFER.name, kind="store")] = [3000, 3600]
    d[S.REQUESTS_IN_FLIGHT.name] = [3, 3]  # busy: not pending-at-idle
    report = diagnose(evidence(d))
    assert report.top.id == "unclassified_anomaly"
    assert [(s.kind, s.pending_s) for s in report.top.facts.stuck_transfers] == [("store", 3600)]


def test_explained_invariants_are_not_double_reported():
    from .test_classifiers import veto_case

    d = veto_case() | rounds(vetoed=[0, 100], deferred=[0, 0], hit=[0, 0])
    d[L(S.ROUNDS_AT_ROW_CEILING.name, verdict="vetoed")] = [0, 100]
    ids = [v.id for v in diagnose(evidence(d)).verdicts]
    assert "capacity_ceiling_veto" in ids and "unclassified_anomaly" not in ids


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_samples_are_named_never_read(bad):
    d = _quiet()
    d[L(S.OLDEST_PENDING_TRANSFER.name, kind="store")] = [0, bad]
    report = diagnose(evidence(d))
    assert report.exit_code == 3
    [u] = [u for u in report.unchecked if u.check == "pending_at_idle"]
    assert u.reasons == (f"series {S.OLDEST_PENDING_TRANSFER.name} non-finite (NaN/Inf samples)",)


def test_non_finite_and_unsorted_samples_never_raise():
    raw = window(_quiet())
    weird = Series(S.LOOKUP_ROUNDS.name, (("verdict", "hit"),), raw.series[0].target,
                   ((T0 + 1, 5.0), (math.nan, 3.0), (T0, 1.0)))
    report = diagnose(evidence_of(RawWindow(raw.source, raw.series + (weird,))))
    assert report.exit_code == 3  # the NaN timestamp makes lookup rounds non-finite


def evidence_of(raw):
    from kvscope.diagnostics.evidence.build import build_evidence

    return build_evidence(raw)


def test_unreachable_target_is_evidence_and_the_rest_is_diagnosed():
    raw = window(_quiet())
    raw = RawWindow(raw.source, raw.series,
                    failures=("rank endpoint http://127.0.0.1:1/metrics unreachable: connection refused",))
    report = diagnose(evidence_of(raw))
    assert report.exit_code == 1 and report.top.id == "targets_unreachable"
    assert report.top.facts.failures == raw.failures
    assert report.to_dict()["failures"] == list(raw.failures)


def test_low_restore_coverage_no_class_explains_is_an_anomaly():
    """What the oracle matrix saw as 'healthy' for some concurrency geometries: the
    tiers held 384 tokens, 128 were offered (row ceiling), no class named it."""
    d = _quiet() | {
        S.RESTORE_HELD_TOKENS.name: [0, 384], S.HIT_TOKENS.name: [0, 128],
        L(S.RESTORE_SHORT_TOKENS.name, reason="row_ceiling"): [0, 256],
        L(S.RESTORE_SHORT_TOKENS.name, reason="not_stored"): [0, 900],
    }
    report = diagnose(evidence(d))
    assert report.exit_code == 1
    anomaly = next(v for v in report.verdicts if v.id == "unclassified_anomaly")
    low = anomaly.facts.low_coverage  # 33 %
    assert (low.offered_tokens, low.held_tokens) == (128, 384)
    assert low.not_offered_by_reason == {"row_ceiling": 256}  # not_stored: never held


def test_full_coverage_but_the_load_cap_token_is_healthy():
    d = _quiet() | {S.RESTORE_HELD_TOKENS.name: [0, 1536], S.HIT_TOKENS.name: [0, 1528],
                    L(S.RESTORE_SHORT_TOKENS.name, reason="load_cap"): [0, 8]}
    assert diagnose(evidence(d)).status == "healthy"
