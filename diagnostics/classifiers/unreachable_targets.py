"""Unreachable targets: a process (often a rank) gave nothing usable.

During an incident the endpoint that does not answer is the likeliest culprit:
it is listed as evidence and the diagnosis runs on the other targets.
"""

from __future__ import annotations

from ..evidence import Evidence
from ..model import Finding
from ..thresholds import Thresholds

ID = "targets_unreachable"
TITLE = "Targets unreachable or unreadable"
SEVERITY = 85
CHECK = "every target answered with readable metrics"
NEEDS = ()
EXPLAINS = frozenset()


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    if not ev.failures:
        return None
    lines = list(ev.failures)
    ok = sorted({s for t in ev.targets for s in (t.target,)})
    lines.append("the diagnosis ran on what the others gave"
                 + (f" ({', '.join(ok)})" if ok else ""))
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.9,
        evidence=lines,
        next_step=("Check those processes first (alive? stuck? log?): a dead or hung rank stops "
                   "reporting and its series are missing from every other verdict."),
        severity=SEVERITY,
    )
