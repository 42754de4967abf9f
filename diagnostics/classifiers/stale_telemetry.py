"""Stale telemetry: the engine stopped stamping steps while work was unfinished.

An idle vLLM engine stops stepping, so an old step timestamp alone is not a
fault; with requests or transfers unfinished it means the engine (or its stats
path) stopped, and every gauge is its last value, not the present.
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Finding, Mark
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
    lines = [
        f"{t}: last scheduler step {secs(age)} before {_when(ev)} (threshold {secs(th.stale_after_s)})"
        for t, age in stale.items()
    ]
    lines.append(
        f"the gauges still show unfinished work ({n(work)} requests/transfers): they are frozen, "
        "not current"
    )
    steps = ev.freshness.steps
    if steps.present and steps.recent == 0:
        lines.append(f"0 scheduler steps in the last {secs(ev.source.recent_span)}")
    marks = [
        Mark("requests", ev.freshness.last_step[t].last, "last step") for t in stale
    ]
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.9,
        evidence=lines,
        next_step=(
            "The engine or its stats path stopped: check the process (and `up` in Prometheus). "
            "Gauge-based verdicts (pending at idle, queue wait) were not judged from these stale values."
        ),
        severity=SEVERITY,
        marks=marks,
    )


def _when(ev: Evidence) -> str:
    return "the second scrape" if ev.source.kind == "scrape" else "the window end"


