"""Run every classifier on one Evidence and rank what holds."""

from __future__ import annotations

import time

from . import classifiers as C
from .classifiers import healthy, stale_telemetry
from .evidence import Evidence, build_evidence
from .model import RawWindow
from .report import Report
from .thresholds import Thresholds


def diagnose(ev: Evidence, thresholds: Thresholds | None = None) -> Report:
    th = thresholds or Thresholds()
    findings, notes = [], []
    for mod in C.CLASSIFIERS:
        try:
            f = mod.classify(ev, th)
        except Exception as e:  # one broken classifier must not hide the others
            notes.append(f"classifier {mod.ID} failed: {type(e).__name__}: {e}")
            continue
        if f is not None:
            findings.append(f)
    if any(f.id == stale_telemetry.ID for f in findings):
        void = [f for f in findings if f.uses_gauges]
        findings = [f for f in findings if not f.uses_gauges]
        notes += [f"not judged from stale gauges: {f.title}" for f in void]
    findings.sort(key=lambda f: f.id)
    findings.sort(key=lambda f: f.score, reverse=True)
    checks = [mod.CHECK for mod in C.CLASSIFIERS]
    if not findings:
        findings = [healthy.finding(ev, checks)]
    return Report.from_findings(ev, findings, checks, notes)


def diagnose_raw(raw: RawWindow, thresholds: Thresholds | None = None) -> Report:
    t0 = time.perf_counter()
    report = diagnose(build_evidence(raw), thresholds)
    report.elapsed_s = time.perf_counter() - t0
    return report
