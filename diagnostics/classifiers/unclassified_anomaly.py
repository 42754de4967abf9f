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

from ..evidence import Evidence
from ..known_bugs import BY_ID
from ..model import Finding, Mark, Quantity
from ..thresholds import Thresholds
from ._common import n, secs, window_word
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


def _rounds(ev: Evidence, th: Thresholds) -> list[str]:
    r = ev.rounds
    if not r.verdicts:
        return []
    total = r.total
    vetoed = r.get(S.Verdict.VETOED).increase
    deferred = r.get(S.Verdict.DEFERRED).increase
    hits = r.get(S.Verdict.HIT).increase
    if total < th.anomaly_min_rounds:
        return []
    w = window_word(ev)
    if vetoed >= th.anomaly_failing_fraction * total:
        return [f"{n(vetoed)} of {n(total)} lookup rounds {w} vetoed ({vetoed / total:.0%}), "
                f"{n(hits)} hit: restores that found keys were thrown away"]
    if hits == 0 and vetoed + deferred >= th.anomaly_failing_fraction * total:
        return [f"{n(vetoed + deferred)} of {n(total)} lookup rounds {w} vetoed or deferred, "
                "0 hit: the tiers found keys and never restored one"]
    return []


def _token_coverage(ev: Evidence, th: Thresholds) -> list[str]:
    """Offered / held tokens (kvscope_restore_held_tokens_total), before vs now."""
    held, offered = ev.coverage.held_tokens, ev.rounds.hit_tokens
    if not (held.present and offered.present):
        return []
    hb, hr = held.increase - held.recent, held.recent
    ob, orc = offered.increase - offered.recent, offered.recent
    if hb <= 0 or hr <= 0:
        return []
    cb, cr = ob / hb, orc / hr
    if cb >= th.anomaly_collapse_before and cr <= th.anomaly_collapse_after:
        return [f"restore coverage collapsed: {cb:.0%} of {n(hb)} tokens the tiers held were "
                f"offered before, {cr:.0%} of {n(hr)} in the last {secs(ev.source.recent_span)}"]
    return []


def _low_coverage(ev: Evidence, th: Thresholds) -> list[str]:
    """Over the window, far fewer tokens offered than the tiers held."""
    held, offered = ev.coverage.held_tokens, ev.rounds.hit_tokens
    if not (held.present and offered.present) or held.increase <= 0:
        return []
    ratio = offered.increase / held.increase
    if ratio >= th.anomaly_coverage_min:
        return []
    why = ", ".join(f"{k} {n(q.increase)}" for k, q in sorted(ev.coverage.short_tokens.items())
                    if q.increase > 0 and k not in S.NOT_HELD)
    return [f"restore coverage {ratio:.0%}: {n(offered.increase)} of {n(held.increase)} tokens the "
            f"tiers held were offered to load {window_word(ev)}"
            + (f" (held tokens not offered, by reason: {why})" if why else "")]


def _coverage(ev: Evidence, th: Thresholds) -> list[str]:
    if got := _token_coverage(ev, th) or _low_coverage(ev, th):
        return got
    r = ev.rounds
    found = (S.Verdict.HIT, S.Verdict.DEFERRED, S.Verdict.VETOED)
    before = {v: r.get(v).increase - r.get(v).recent for v in found}
    recent = {v: r.get(v).recent for v in found}
    nb, nr = sum(before.values()), sum(recent.values())
    if nb < 10 or nr < 10:
        return []
    rb, rr = before[S.Verdict.HIT] / nb, recent[S.Verdict.HIT] / nr
    if rb >= th.anomaly_collapse_before and rr <= th.anomaly_collapse_after:
        return [f"restore hit ratio collapsed: {rb:.0%} of {n(nb)} rounds that found keys hit "
                f"before, {rr:.0%} of {n(nr)} in the last {secs(ev.source.recent_span)}"]
    return []


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


def _stuck(ev: Evidence, th: Thresholds) -> tuple[list[str], list[Mark]]:
    limit = th.anomaly_stuck_factor * th.pending_after_s
    lines, marks = [], []
    for kind, age in ev.pending.oldest_seconds.items():
        if age.present and age.max >= limit:
            t_peak = max(age.samples, key=lambda p: p[1])[0] if age.samples else ev.source.end
            lines.append(f"a {kind} transfer pending {secs(age.max)} (≥ {th.anomaly_stuck_factor:g}× "
                         f"--stuck-after {secs(th.pending_after_s)}): longer than any real transfer")
            marks.append(Mark("pending", t_peak - age.max, f"{kind} pending since"))
    if S.OLDEST_PENDING_TRANSFER.name not in ev.present:
        for kind, q in ev.pending.transfers.items():
            span = _longest_idle_pending(q, ev)
            if span >= limit:
                lines.append(f"{n(q.max)} {kind} transfer(s) pending for {secs(span)} on an idle engine "
                             f"({S.OLDEST_PENDING_TRANSFER.name} missing: the age is at least that)")
    return lines, marks


def _contained_fault(ev: Evidence) -> list[str]:
    versions = sorted({t.vllm_version for t in ev.targets})
    if not versions:  # the release is unknown: known_vllm_bug could not check
        return []
    lines = []
    for fault, count in contained_faults(ev).items():
        bug = BY_ID.get(fault)
        if bug is not None and affected_engines(ev, bug):
            continue
        fixed = f" (fixed in vLLM {bug.fixed_in})" if bug is not None and bug.fixed_in else ""
        lines.append(f"kvscope counted {n(count)} contained vLLM fault(s) {fault} "
                     f"{window_word(ev)}, yet no engine here runs a release with that bug{fixed}: "
                     f"vLLM {', '.join(versions)}, where kvscope wraps nothing for it (a window "
                     f"mixing engines, or one mislabelled)")
    return lines


def classify(ev: Evidence, th: Thresholds, findings: list[Finding], modules=()) -> Finding | None:
    explained = _explained(findings, modules, ev)
    lines: list[str] = []
    marks: list[Mark] = []
    kinds = []
    if "rounds" not in explained and (got := _rounds(ev, th)):
        lines += got
        kinds.append("rounds")
    if "coverage" not in explained and (got := _coverage(ev, th)):
        lines += got
        kinds.append("coverage")
    if "stuck_transfer" not in explained:
        got, mk = _stuck(ev, th)
        if got:
            lines += got
            marks += mk
            kinds.append("stuck_transfer")
    if "contained_fault" not in explained and (got := _contained_fault(ev)):
        lines += got
        kinds.append("contained_fault")
    if not lines:
        return None
    if ev.failures:
        lines.append(f"{len(ev.failures)} target(s) gave nothing usable: their series are not in this evidence")
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.6,
        evidence=lines,
        next_step=(
            "kv-diagnose knows no incident class for this: treat it as an incident. Look at the "
            "'could not check' lines (missing series hide the class that would explain it), then "
            "at the engine's log around the first mark; attach a bundle (kv-diagnose record) to "
            "the ticket."
        ),
        severity=SEVERITY,
        marks=marks,
    )
