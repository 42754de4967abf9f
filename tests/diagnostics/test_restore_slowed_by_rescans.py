"""restore_slowed_by_rescans on synthetic windows shaped as the 1M-token H100 restores
(gpu_scale.py's h100_1m_restore_9f632a1_b.json, first on iteration: 18.8 s, of
which 15.5 s in 182 deferred rescans of 62,500 keys, 1.46 s of tier reads, 0.28 s of GPU load)
and as a 131k-token one (0.9 s), and what ranks above it."""

from __future__ import annotations

from kvscope.diagnostics.classifiers import restore_slowed_by_rescans as rs
from kvscope.diagnostics.thresholds import Thresholds
from kvscope.diagnostics.verdict.diagnose import diagnose
from kvscope.exporters import signals as S

from .support import L, base, evidence

TH = Thresholds()


def restores(rescans_s: float, reads_s: float, load_s: float, rescans: int, keys: int,
             n: int = 1) -> dict:
    total = rescans_s + reads_s + load_s
    phases = {S.RestorePhase.DEFERRED_RESCANS: rescans_s, S.RestorePhase.WAITING_FOR_ROWS: 0.0,
              S.RestorePhase.TIER_READS: reads_s, S.RestorePhase.GPU_LOAD: load_s}
    d = {L(S.RESTORE_PHASE_SECONDS.name, phase=p.value): [0, s] for p, s in phases.items()}
    d[L(S.RESTORE_DURATION.name + "_count", prefix=S.PrefixLength.UP_TO_1M.value)] = [0, n]
    d[L(S.RESTORE_DURATION.name + "_sum", prefix=S.PrefixLength.UP_TO_1M.value)] = [0, total]
    d[S.RESTORE_RESCANS.name] = [0, rescans]
    d[S.RESTORE_RESCAN_KEYS.name] = [0, rescans * keys]
    return d


def busy() -> dict:
    """An engine restoring: one request deferred (the next long re-ask waits on its tier)."""
    return base() | {L(S.REQUESTS.name, state=S.RequestState.DEFERRED.value): [1, 1],
                     S.REQUESTS_IN_FLIGHT.name: [1, 1]}


def test_a_million_token_restore_is_named_with_its_rescans():
    ev = evidence(busy() | restores(15.5246, 1.4612, 0.2762, 182, 62_500))
    f = rs.classify(ev, TH)
    assert f is not None and f.id == rs.ID
    assert f.facts.rescans == 182 and f.facts.keys_per_rescan == 62_500
    assert round(f.facts.share, 3) == round(15.5246 / (15.5246 + 1.4612 + 0.2762), 3)
    assert f.facts.phase_s[S.RestorePhase.DEFERRED_RESCANS.value] == 15.5246
    assert "62,500" in f.next_step or "62500" in f.next_step


def test_a_short_restore_or_one_the_tier_reads_dominate_is_not():
    # a 131k restore: under slow_restore_s however it splits
    assert rs.classify(evidence(busy() | restores(0.6, 0.2, 0.1, 20, 8_190)), TH) is None
    # long, but the tier's reads took most of it (a slow disk: not the rescans)
    assert rs.classify(evidence(busy() | restores(4.0, 30.0, 0.5, 50, 8_190)), TH) is None
    # an engine without the split (an older kvscope) is not judged
    assert rs.classify(evidence(busy()), TH) is None


def test_an_idle_engine_reads_idle_after_slow_restores():
    """Every request finished, nothing in flight: the past restores name nothing."""
    report = diagnose(evidence(base() | restores(15.5246, 1.4612, 0.2762, 182, 62_500)), TH)
    assert report.top.id == "healthy" and report.exit_code == 0


def test_the_slow_restore_ranks_below_the_incidents_and_does_not_make_an_anomaly():
    report = diagnose(evidence(busy() | restores(15.5246, 1.4612, 0.2762, 182, 62_500)), TH)
    assert report.top.id == rs.ID
    assert "unclassified_anomaly" not in {v.id for v in report.verdicts}
    assert rs.SEVERITY < min(m.SEVERITY for m in _incident_modules())


def _incident_modules():
    from kvscope.diagnostics.classifiers import CLASSIFIERS

    return [m for m in CLASSIFIERS if m is not rs and hasattr(m, "SEVERITY")
            and m.ID not in ("unclassified_anomaly",)]
