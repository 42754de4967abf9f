"""kvscope's own errors leave its counters with holes: the verdict is never healthy then.

Windows here are synthetic (the engine's rule on one input); the same rule on a real
engine whose kvscope lost its rounds during a truncated restore, through a real
Prometheus, is tests/diagnostics/test_lost_rounds.py.
"""

from __future__ import annotations

import math

from kvscope.diagnostics.report.diagnosis import EXIT_INCONCLUSIVE, format_text
from kvscope.diagnostics.verdict import telemetry_gaps
from kvscope.diagnostics.verdict.diagnose import diagnose
from kvscope.exporters import signals as S

from . import test_classifiers as C
from .support import L, _with_declared, evidence
from .test_golden import _healthy

ERRORS = S.TELEMETRY_ERRORS.name


def _errors(where: str, vals: list[float]) -> dict:
    return {L(ERRORS, where=where): vals}


def test_healthy_window_stays_healthy_without_errors():
    report = diagnose(evidence(_healthy(), lifetime=False))
    assert report.status == "healthy", format_text(report)


def test_errors_rising_in_the_window_make_it_inconclusive():
    d = _healthy() | _errors("aggregator", [2, 9]) | _errors("round", [0, 1])
    report = diagnose(evidence(d, lifetime=False))
    text = format_text(report)
    assert report.status == "inconclusive" and report.exit_code == EXIT_INCONCLUSIVE, text
    assert report.top.id == "inconclusive", text
    gap = [u for u in report.unchecked if u.check == telemetry_gaps.ID]
    assert len(gap) == 1, text
    assert f'{ERRORS}{{where="aggregator"}} rose by 7 in the window' in gap[0].reasons, text
    assert f'{ERRORS}{{where="round"}} rose by 1 in the window' in gap[0].reasons, text
    assert report.top.next_step.startswith("Not healthy. kvscope caught errors"), text
    assert "Make the missing series" not in report.top.next_step, text


def test_a_counter_born_inside_the_window_counts_from_zero():
    """The counter has no zero series before a process's first error: one that appears
    mid-window at 3 rose by 3 (read as flat, it would pass for no error)."""
    d = _healthy() | _errors("step", [3])  # one sample, at the window's end
    report = diagnose(evidence(d, lifetime=False))
    assert report.status == "inconclusive", format_text(report)
    assert any('where="step"} rose by 3' in r for u in report.unchecked for r in u.reasons)


def test_errors_from_before_the_window_do_not_count():
    d = _healthy() | _errors("round", [4, 4])  # present from the window's start, flat
    report = diagnose(evidence(d, lifetime=False))
    assert report.status == "healthy", format_text(report)


def test_a_scrape_counts_the_process_lifetime():
    """A scrape's counters are lifetime totals: an error since start leaves a hole in them."""
    d = _healthy() | _errors("round", [4, 4])
    report = diagnose(evidence(d, lifetime=True))
    text = format_text(report)
    assert report.status == "inconclusive", text
    assert f'{ERRORS}{{where="round"}} rose by 4 since process start' in text, text


def test_an_incident_stands_with_the_gap_named_beside_it():
    d = C.veto_case() | _errors("round", [0, 2])
    report = diagnose(evidence(d, lifetime=False))
    text = format_text(report)
    assert report.status == "incident" and report.top.id == "capacity_ceiling_veto", text
    assert "Could not check:" in text and f'{ERRORS}{{where="round"}} rose by 2' in text, text


def test_an_input_without_the_counter_cannot_say_kvscope_recorded_everything():
    """Declared at 0 for every site from the first step: an input without it lost it."""
    d = {k: v for k, v in _with_declared(_healthy()).items() if ERRORS not in k}
    report = diagnose(evidence(d, lifetime=False, declare=False))
    text = format_text(report)
    assert report.status == "inconclusive", text
    assert f"series {ERRORS} missing" in text, text


def test_non_finite_errors_are_unchecked():
    d = _healthy() | _errors("round", [0, math.nan])
    report = diagnose(evidence(d, lifetime=False))
    assert report.status == "inconclusive", format_text(report)
