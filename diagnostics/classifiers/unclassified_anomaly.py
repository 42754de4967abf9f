"""Unclassified anomaly: an invariant broke and no known incident class explains it.

Runs after every other classifier (``AFTER``) with their findings. Each
invariant has a kind; a finding whose module lists that kind in ``EXPLAINS``
explains it (a module that declares nothing explains the restore-path kinds,
so a new incident class does not double-report as an anomaly). The invariants:

* ``rounds``: most lookup rounds vetoed, or deferred without a single hit;
* ``coverage``: restore coverage (tokens offered / tokens the tiers held) below
  half over the window or collapsed (was high, is near zero now); without the
  coverage series, the restore hit ratio collapsed;
* ``stuck_transfer``: a transfer pending far longer than any real one (age
  gauge), or, without the age gauge, pending the whole time on an idle engine;
* ``contained_fault``: kvscope counted a contained vLLM fault, yet no engine in the window
  runs a release with that bug (``known_bugs``): kvscope wraps nothing there.

Each invariant runs on the series that are present; a missing one is already
reported as "could not check" by the classifiers that need it.
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..known_bugs import BY_ID
from ..model import Finding, Mark, Quantity
from ..thresholds import Thresholds
from .anomaly_facts import (
    AnomalyFacts,
    Collapse,
    IdlePending,
    LowCoverage,
    RoundsFailing,
    StrayFault,
    StuckTransfer,
)
from .known_vllm_bug import affected_engines, contained_faults

ID = "unclassified_anomaly"
TITLE = "Unclassified anomaly (an invariant broke; no known incident class explains it)"
SEVERITY = 65
CHECK = ("invariants no incident may break unexplained: most rounds vetoed or deferred, "
         "restore coverage low or collapsed, a transfer pending far longer than any real one, "
         "a vLLM fault contained on a release without that bug")
NEEDS = ()
AFTER = True
DEFAULT_EXPLAINS = frozenset({"rounds", "coverage"})


def _explained(findings: list[Finding], modules, ev: Evidence) -> set[str]:
    """Invariant kinds the incident findings explain: a module's ``explains(ev)`` where what
    it explains depends on what it found, else its ``EXPLAINS``."""
    by_id = {m.ID: m for m in modules}
    out: set[str] = set()
    for f in findings:
        if f.kind != "incident":
            continue
        mod = by_id.get(f.id)
        if mod is not None and hasattr(mod, "explains"):
            out |= set(mod.explains(ev))
            continue
        out |= set(getattr(mod, "EXPLAINS", DEFAULT_EXPLAINS)) if mod else DEFAULT_EXPLAINS
    return out


def _rounds(ev: Evidence, th: Thresholds) -> RoundsFailing | None:
    r = ev.rounds
    if not r.verdicts:
        return None
    total = r.total
    vetoed = r.get(S.Verdict.VETOED).increase
    deferred = r.get(S.Verdict.DEFERRED).increase
    hits = r.get(S.Verdict.HIT).increase
    if total < th.anomaly_min_rounds:
        return None
    mostly_vetoed = vetoed >= th.anomaly_failing_fraction * total
    if mostly_vetoed or (hits == 0 and vetoed + deferred >= th.anomaly_failing_fraction * total):
        return RoundsFailing(ev.source.lifetime, total, vetoed, deferred, hits, mostly_vetoed)
    return None


def _token_coverage(ev: Evidence, th: Thresholds) -> Collapse | None:
    """Offered / held tokens (kvscope_restore_held_tokens_total), before vs now."""
    held, offered = ev.coverage.held_tokens, ev.rounds.hit_tokens
    if not (held.present and offered.present):
        return None
    hb, hr = held.increase - held.recent, held.recent
    ob, orc = offered.increase - offered.recent, offered.recent
    if hb <= 0 or hr <= 0:
        return None
    cb, cr = ob / hb, orc / hr
    if cb >= th.anomaly_collapse_before and cr <= th.anomaly_collapse_after:
        return Collapse("tokens", cb, hb, cr, hr, ev.source.recent_span)
    return None


def _low_coverage(ev: Evidence, th: Thresholds) -> LowCoverage | None:
    """Over the window, far fewer tokens offered than the tiers held."""
    held, offered = ev.coverage.held_tokens, ev.rounds.hit_tokens
    if not (held.present and offered.present) or held.increase <= 0:
        return None
    if offered.increase / held.increase >= th.anomaly_coverage_min:
        return None
    why = {k: q.increase for k, q in sorted(ev.coverage.short_tokens.items())
           if q.increase > 0 and k not in S.NOT_HELD}
    return LowCoverage(ev.source.lifetime, offered.increase, held.increase, why)


def _coverage(ev: Evidence, th: Thresholds) -> tuple[Collapse | None, LowCoverage | None]:
    if got := _token_coverage(ev, th):
        return got, None
    if low := _low_coverage(ev, th):
        return None, low
    r = ev.rounds
    found = (S.Verdict.HIT, S.Verdict.DEFERRED, S.Verdict.VETOED)
    before = {v: r.get(v).increase - r.get(v).recent for v in found}
    recent = {v: r.get(v).recent for v in found}
    nb, nr = sum(before.values()), sum(recent.values())
    if nb < 10 or nr < 10:
        return None, None
    rb, rr = before[S.Verdict.HIT] / nb, recent[S.Verdict.HIT] / nr
    if rb >= th.anomaly_collapse_before and rr <= th.anomaly_collapse_after:
        return Collapse("rounds", rb, nb, rr, nr, ev.source.recent_span), None
    return None, None


def _longest_idle_pending(q: Quantity, ev: Evidence) -> float:
    """Longest span the pending gauge stayed > 0 while no request was in flight."""
    busy = ev.requests.in_flight
    if not busy.present:
        return 0.0
    busy_at = dict(busy.samples)
    best = 0.0
    start = None
    for t, v in q.samples:
        idle = busy_at.get(t, 0.0) == 0
        if v > 0 and idle:
            start = t if start is None else start
            best = max(best, t - start)
        else:
            start = None
    return best


def _stuck(ev: Evidence, th: Thresholds) -> tuple[list[StuckTransfer], list[IdlePending], list[Mark]]:
    limit = th.anomaly_stuck_factor * th.pending_after_s
    stuck, idle, marks = [], [], []
    for kind, age in ev.pending.oldest_seconds.items():
        if age.present and age.max >= limit:
            t_peak = max(age.samples, key=lambda p: p[1])[0] if age.samples else ev.source.end
            stuck.append(StuckTransfer(kind, age.max, th.anomaly_stuck_factor, th.pending_after_s))
            marks.append(Mark("pending", t_peak - age.max, f"{kind} pending since"))
    if S.OLDEST_PENDING_TRANSFER.name not in ev.present:
        for kind, q in ev.pending.transfers.items():
            span = _longest_idle_pending(q, ev)
            if span >= limit:
                idle.append(IdlePending(kind, q.max, span))
    return stuck, idle, marks


def _contained_fault(ev: Evidence) -> list[StrayFault]:
    versions = tuple(sorted({t.vllm_version for t in ev.targets}))
    if not versions:  # the release is unknown: known_vllm_bug could not check
        return []
    out = []
    for fault, count in contained_faults(ev).items():
        bug = BY_ID.get(fault)
        if bug is not None and affected_engines(ev, bug):
            continue
        out.append(StrayFault(ev.source.lifetime, fault, count,
                              bug.fixed_in if bug is not None and bug.fixed_in else None, versions))
    return out


def classify(ev: Evidence, th: Thresholds, findings: list[Finding], modules=()) -> Finding | None:
    explained = _explained(findings, modules, ev)
    collapsed, low = _coverage(ev, th) if "coverage" not in explained else (None, None)
    stuck, idle, marks = _stuck(ev, th) if "stuck_transfer" not in explained else ([], [], [])
    facts = AnomalyFacts(
        rounds_failing=_rounds(ev, th) if "rounds" not in explained else None,
        coverage_collapsed=collapsed,
        low_coverage=low,
        stuck_transfers=tuple(stuck),
        idle_pending=tuple(idle),
        stray_faults=tuple(_contained_fault(ev)) if "contained_fault" not in explained else (),
        failed_targets=len(ev.failures),
    )
    if not facts.broken:
        return None
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.6,
        facts=facts,
        next_step=(
            "kv-diagnose knows no incident class for this: treat it as an incident. Look at the "
            "'could not check' lines (missing series hide the class that would explain it), then "
            "at the engine's log around the first mark; attach a bundle (kv-diagnose record) to "
            "the ticket."
        ),
        severity=SEVERITY,
        marks=marks,
    )
