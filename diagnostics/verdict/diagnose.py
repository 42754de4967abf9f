"""Run every classifier on one Evidence and rank what holds.

Healthy means checked: a classifier whose series are missing or non-finite is
not run and is reported as "could not check", as is one that read a label value
the export lacks (:mod:`..evidence.partial`) or needs per-rank series of a rank no series
names (:mod:`.ranks`); one that raises becomes an error finding. A rise of kvscope's
own error counter leaves every check unproven (:mod:`.telemetry_gaps`), as do several
engines summed into one window (:mod:`.one_engine`). The verdict is healthy only when
every check ran on one engine's whole counters and none holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .. import classifiers as C
from ..classifiers import healthy, stale_telemetry
from ..classifiers.needs import needs_of, unmet
from ..evidence import partial
from ..evidence.build import Evidence, build_evidence
from ..model import Facts, Finding, RawWindow, Unchecked
from ..report.diagnosis import Report
from ..thresholds import Thresholds
from . import one_engine, ranks, telemetry_gaps

CHECK_FAILED = "check_failed"
# Checks of the whole window, run after the classifiers: each module has ID, CHECK,
# unchecked(ev) (an Unchecked or None) and next_step(ev) (its own remedy).
WINDOW_CHECKS = (one_engine, telemetry_gaps)


@dataclass(frozen=True)
class CheckFailedFacts(Facts):
    """A check that raised: never a pass."""

    error: str  # the exception's type name
    message: str  # its first line, at most 200 characters ("" none)
    check: str  # the check's CHECK sentence

    def lines(self) -> list[str]:
        return [f"{self.error}: {self.message}" if self.message else self.error,
                f"unchecked: {self.check}"]


def _error(mod, e: BaseException) -> Finding:
    msg = str(e).splitlines()[0][:200] if str(e) else ""
    return Finding(
        id=f"{CHECK_FAILED}:{mod.ID}",
        title=f"Check {mod.ID} failed (not a pass)",
        confidence=1.0,
        facts=CheckFailedFacts(type(e).__name__, msg, mod.CHECK),
        next_step=("kv-diagnose could not judge this class on this input: report it with the "
                   "bundle (kv-diagnose record) attached; judge the class from the dashboards."),
        severity=5,
        kind="error",
    )


def _run(mod, ev: Evidence, th: Thresholds, *extra) -> tuple[Finding | None, Unchecked | None]:
    needs = needs_of(mod, ev)
    reasons = unmet(ev, needs)
    if reasons:
        return None, Unchecked(mod.ID, mod.CHECK, tuple(reasons))
    try:
        with partial.reads() as dropped:
            found = mod.classify(ev, th, *extra)
    except Exception as e:  # one broken classifier must not hide the others, nor pass
        return _error(mod, e), None
    # It read a label value the export lacks, or judged per-rank series without every
    # rank: its silence is no pass (a finding it made anyway stands, with the gap named
    # beside it).
    gaps = partial.reasons(dropped) + ranks.reasons(ev, needs)
    return found, Unchecked(mod.ID, mod.CHECK, gaps) if gaps else None


def diagnose(ev: Evidence, thresholds: Thresholds | None = None) -> Report:
    th = thresholds or Thresholds()
    findings: list[Finding] = []
    unchecked: list[Unchecked] = []
    notes = list(ev.notes)
    if (note := ranks.unknown_note(ev)) is not None:
        notes.append(note)
    first = [m for m in C.CLASSIFIERS if not getattr(m, "AFTER", False)]
    after = [m for m in C.CLASSIFIERS if getattr(m, "AFTER", False)]
    for mod in first:
        f, u = _run(mod, ev, th)
        findings += [f] if f is not None else []
        unchecked += [u] if u is not None else []
    if any(f.id == stale_telemetry.ID for f in findings):
        void = [f for f in findings if f.uses_gauges]
        findings = [f for f in findings if not f.uses_gauges]
        notes += [f"not judged from stale gauges: {f.title}" for f in void]
    for mod in after:
        f, u = _run(mod, ev, th, list(findings), C.CLASSIFIERS)
        findings += [f] if f is not None else []
        unchecked += [u] if u is not None else []
    findings.sort(key=lambda f: f.id)
    findings.sort(key=lambda f: f.score, reverse=True)
    checks = [mod.CHECK for mod in C.CLASSIFIERS] + [g.CHECK for g in WINDOW_CHECKS]
    gaps = [(g, u) for g in WINDOW_CHECKS if (u := g.unchecked(ev)) is not None]
    unchecked += [u for _, u in gaps]
    errors = [f for f in findings if f.kind == "error"]
    if not any(f.kind == "incident" for f in findings):
        top = (healthy.inconclusive(ev, unchecked, errors,
                                    {g.ID: g.next_step(ev) for g, _ in gaps})
               if unchecked or errors else healthy.finding(ev, checks))
        findings = [top] + errors
    return Report.from_findings(ev, findings, checks, notes, unchecked, th)


def diagnose_raw(raw: RawWindow, thresholds: Thresholds | None = None) -> Report:
    t0 = time.perf_counter()
    report = diagnose(build_evidence(raw), thresholds)
    report.elapsed_s = time.perf_counter() - t0
    return report
