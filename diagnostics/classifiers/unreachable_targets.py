"""Unreachable targets: a process (often a rank) gave nothing usable.

During an incident the endpoint that does not answer is the likeliest culprit:
it is listed as evidence and the diagnosis runs on the other targets.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..evidence.build import Evidence
from ..model import Facts, Finding
from ..thresholds import Thresholds

ID = "targets_unreachable"
TITLE = "Targets unreachable or unreadable"
SEVERITY = 85
CHECK = "every target answered with readable metrics"
NEEDS = ()
EXPLAINS = frozenset()


@dataclass(frozen=True)
class UnreachableFacts(Facts):
    failures: tuple[str, ...]  # one line per target or query that gave nothing usable
    answered: tuple[str, ...]  # the targets the diagnosis ran on, sorted

    def lines(self) -> list[str]:
        return [*self.failures, "the diagnosis ran on what the others gave"
                + (f" ({', '.join(self.answered)})" if self.answered else "")]


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    if not ev.failures:
        return None
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.9,
        facts=UnreachableFacts(tuple(ev.failures), tuple(sorted({t.target for t in ev.targets}))),
        next_step=("Check those processes first (alive? stuck? log?): a dead or hung rank stops "
                   "reporting and its series are missing from every other verdict."),
        severity=SEVERITY,
    )
