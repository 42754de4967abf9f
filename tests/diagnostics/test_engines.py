"""Several engines in one window: their sums hide one engine's incident, so never healthy.

Synthetic windows (the engine's rule on one input): engine A idles with a store stuck
96 s (pending at idle on its own), engine B serves. Summed, "nothing runs or waits"
is false and A's stuck transfer passed for healthy.
"""

from __future__ import annotations

from kvscope.diagnostics.report.diagnosis import EXIT_INCONCLUSIVE, format_text
from kvscope.diagnostics.verdict import one_engine
from kvscope.diagnostics.verdict.diagnose import diagnose
from kvscope.exporters import signals as S

from . import test_classifiers as C
from .support import L, base, evidence, on
from .test_golden import _healthy

A = "10.0.0.1:9400"
B = "10.0.0.2:9400"


def _serving() -> dict:
    d = base() | C.rounds(hit=[10, 12], miss=[2, 2])
    d[L(S.REQUESTS.name, state="running")] = [3, 3]
    return d


def test_the_stuck_engine_alone_is_pending_at_idle():
    report = diagnose(evidence(on(A, C.pending_case()), lifetime=False))
    assert report.top.id == "pending_at_idle", format_text(report)


def test_a_stuck_idle_engine_beside_a_serving_one_is_not_healthy():
    report = diagnose(evidence(on(A, C.pending_case()) | on(B, _serving()), lifetime=False))
    text = format_text(report)
    assert report.status == "inconclusive" and report.exit_code == EXIT_INCONCLUSIVE, text
    gap = [u for u in report.unchecked if u.check == one_engine.ID]
    assert gap and gap[0].reasons[0] == f"2 engines in this window: {A}, {B}", text
    assert f"--selector that matches one of them, e.g. '{{instance=\"{A}\"}}'" \
        in report.top.next_step, text


def test_a_scrape_of_several_engines_says_to_scrape_one():
    report = diagnose(evidence(on(A, C.pending_case()) | on(B, _serving()), lifetime=True))
    assert report.status == "inconclusive", format_text(report)
    assert f"--scrape with one engine's URL (e.g. {A})" in report.top.next_step


def test_an_incident_on_one_engine_stands_with_the_gap_named():
    report = diagnose(evidence(on(A, C.veto_case()) | on(B, _serving()), lifetime=False))
    text = format_text(report)
    assert report.status == "incident" and report.top.id == "capacity_ceiling_veto", text
    assert "could not check one_engine" in text, text


def test_one_engine_and_its_ranks_own_endpoints_is_one_engine():
    """kvscope's standalone exporter serves each worker rank on a port of its own: targets
    without kvscope_info are ranks, not engines."""
    d = on(A, _healthy()) | on("10.0.0.1:9401", {
        L(S.TRANSFERS_IN_FLIGHT.name, rank="0", direction="gpu_to_cpu"): [0, 0]})
    report = diagnose(evidence(d, lifetime=False))
    assert report.status == "healthy", format_text(report)


def test_an_engine_without_its_info_series_still_counts():
    """A relabel rule dropped engine B's kvscope_info: its scheduler steps still name it."""
    b = {k: v for k, v in _serving().items() if not (isinstance(k, tuple) and k[0] == S.INFO.name)}
    report = diagnose(evidence(on(A, C.pending_case()) | on(B, b), lifetime=False))
    gap = [u for u in report.unchecked if u.check == one_engine.ID]
    assert gap and gap[0].reasons[0] == f"2 engines in this window: {A}, {B}", format_text(report)


def test_one_engine_restarted_with_another_seed_is_one_engine():
    d = _healthy()
    d[C.info(seed="ffff")] = [1]  # the restarted process's info series, same target
    report = diagnose(evidence(d, lifetime=False))
    assert not [u for u in report.unchecked if u.check == one_engine.ID], format_text(report)
