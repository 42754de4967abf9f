"""Stale telemetry: the engine stopped stamping steps while work was unfinished.

An idle vLLM engine stops stepping, so an old step timestamp alone is not a
fault; with requests or transfers unfinished it means the engine (or its stats
path) stopped, and every gauge is its last value, not the present.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n, secs

ID = "stale_telemetry"
TITLE = "Stale telemetry"
SEVERITY = 90
CHECK = f"freshness of {S.LAST_STEP_TIMESTAMP.name} against the source's now"
NEEDS = (S.LAST_STEP_TIMESTAMP, S.REQUESTS_IN_FLIGHT, S.REQUESTS, S.PENDING_TRANSFERS)
EXPLAINS = frozenset({"stuck_transfer"})  # frozen gauges: an old transfer may be no transfer


def unfinished(ev: Evidence) -> float:
    return (
        ev.requests.in_flight.last
        + sum(q.last for q in ev.requests.states.values())
        + sum(q.last for q in ev.pending.transfers.values())
    )


@dataclass(frozen=True)
class StaleTarget:
    target: str
    step_age_s: float  # seconds since its last scheduler step


@dataclass(frozen=True)
class StaleFacts(Facts):
    stale: tuple[StaleTarget, ...]
    judged_at: str  # "scrape" (the second scrape) | "window_end"
    threshold_s: float  # --stale-after
    unfinished: float  # requests/transfers the frozen gauges still show
    steps_recent: float | None  # scheduler steps in the recent span; None: not exported
    recent_span_s: float

    def lines(self) -> list[str]:
        when = "the second scrape" if self.judged_at == "scrape" else "the window end"
        lines = [f"{s.target}: last scheduler step {secs(s.step_age_s)} before {when} "
                 f"(threshold {secs(self.threshold_s)})" for s in self.stale]
        lines.append(f"the gauges still show unfinished work ({n(self.unfinished)} "
                     "requests/transfers): they are frozen, not current")
        if self.steps_recent == 0:
            lines.append(f"0 scheduler steps in the last {secs(self.recent_span_s)}")
        return lines


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    stale = {
        t: age for t in ev.freshness.last_step
        if (age := ev.freshness.age(t)) is not None and age > th.stale_after_s
    }
    if not stale:
        return None
    work = unfinished(ev)
    if work <= 0:
        return None  # an idle engine does not step: its gauges are its present
    steps = ev.freshness.steps
    facts = StaleFacts(
        stale=tuple(StaleTarget(t, age) for t, age in stale.items()),
        judged_at="scrape" if ev.source.kind == "scrape" else "window_end",
        threshold_s=th.stale_after_s,
        unfinished=work,
        steps_recent=steps.recent if steps.present else None,
        recent_span_s=ev.source.recent_span,
    )
    marks = [
        Mark("requests", ev.freshness.last_step[t].last, "last step") for t in stale
    ]
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.9,
        facts=facts,
        next_step=(
            "The engine or its stats path stopped: check the process (and `up` in Prometheus). "
            "Gauge-based verdicts (pending at idle, queue wait) were not judged from these stale values."
        ),
        severity=SEVERITY,
        marks=marks,
    )
