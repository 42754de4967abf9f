"""Promotion stalled: requests wait on a disk -> CPU promotion that does not finish.

A request whose prefix is on disk waits (deferred round after round) until its
promotion lands. When the disk tier's reads hang (a hung mount, a stuck I/O
pool) the promotion never lands and the request waits on. Unlike pending at
idle the engine is busy (the waiting request keeps it stepping); unlike the
livelock form of the capacity ceiling nothing churns: one old promotion, no
new ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n, secs
from .shared_facts import window_phrase

ID = "promotion_stalled"
TITLE = "Promotion stalled (requests wait on the disk tier)"
SEVERITY = 70
CHECK = "requests deferred behind a disk -> CPU promotion older than --stuck-after"
NEEDS = (S.PENDING_TRANSFERS, S.OLDEST_PENDING_TRANSFER, S.REQUESTS)
EXPLAINS = frozenset({"rounds", "coverage", "stuck_transfer"})
_KIND = S.PendingKind.PROMOTION.value


@dataclass(frozen=True)
class StalledFacts(Facts):
    lifetime: bool
    pending_promotions: float
    oldest_s: float
    threshold_s: float  # --stuck-after
    deferred_requests: float  # requests deferred now, waiting on it
    deferred_rounds: float | None  # None: the lookup-round series lacks the verdict
    hit_rounds: float | None
    promotions_started: float

    def lines(self) -> list[str]:
        w, p, d = window_phrase(self.lifetime), self.pending_promotions, self.deferred_requests
        lines = [
            f"{n(p)} promotion{'s' if p != 1 else ''} pending, oldest "
            f"{secs(self.oldest_s)} (threshold {secs(self.threshold_s)}, --stuck-after)",
            f"{n(d)} request{'s' if d != 1 else ''} deferred, waiting on it",
        ]
        if self.deferred_rounds is not None and self.hit_rounds is not None:
            lines.append(f"{n(self.deferred_rounds)} lookup rounds deferred {w}, "
                         f"{n(self.hit_rounds)} hit")
        lines.append(f"{n(self.promotions_started)} promotions started {w}: nothing churns, one waits")
        return lines


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    pending = ev.pending.transfers.get(_KIND)
    age = ev.pending.oldest_seconds.get(_KIND)
    waiting = ev.requests.get(S.RequestState.DEFERRED)
    if pending is None or age is None or not age.present or pending.last <= 0:
        return None
    if age.last < th.pending_after_s or waiting.last <= 0:
        return None  # young, or nobody waits on it (idle: pending at idle says it)
    r = ev.rounds
    hits = r.verdicts.get(S.Verdict.HIT.value)
    deferred = r.verdicts.get(S.Verdict.DEFERRED.value)
    facts = StalledFacts(
        lifetime=ev.source.lifetime,
        pending_promotions=pending.last,
        oldest_s=age.last,
        threshold_s=th.pending_after_s,
        deferred_requests=waiting.last,
        deferred_rounds=deferred.increase if deferred is not None else None,
        hit_rounds=hits.increase if hits is not None else None,
        promotions_started=ev.tiers.promotion(S.PromotionResult.STARTED).increase,
    )
    marks = []
    if pending.samples:
        marks.append(Mark("pending", pending.samples[-1][0] - age.last, "promotion stuck since"))
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.8,
        facts=facts,
        next_step=(
            "The disk tier's reads do not complete: check its mount and device on the engine host "
            "(a hung NFS/FUSE mount, I/O errors in the kernel and vLLM logs, the fs tier's read "
            "threads). Requests waiting on it stay deferred; aborting them kills vLLM 0.26's "
            "scheduler (benchmarks/README.md), so fix the tier or restart the engine."),
        severity=SEVERITY,
        marks=marks,
        uses_gauges=True,
    )
