"""Pending at idle: transfers unfinished while nothing runs or waits.

vLLM never idles while transfers are pending: it keeps taking empty steps. A
transfer older than any real one on an otherwise idle engine is stuck (a worker
that never reports, a hung fs thread pool, an unflushed reset fence).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n, secs

ID = "pending_at_idle"
TITLE = "Transfers pending on an idle engine"
SEVERITY = 70
CHECK = "transfers pending while nothing runs or waits (pending at idle)"
NEEDS = (S.PENDING_TRANSFERS, S.OLDEST_PENDING_TRANSFER, S.REQUESTS_IN_FLIGHT, S.REQUESTS)
EXPLAINS = frozenset({"stuck_transfer"})

_NEXT = {
    S.PendingKind.LOAD.value: "a rank never reported its load job",
    S.PendingKind.STORE.value: "a rank never reported its store job",
    S.PendingKind.PROMOTION.value: "the fs tier's read pool never finished a promotion",
    S.PendingKind.CASCADE.value: "the fs tier's write pool never finished a cascade",
}


@dataclass(frozen=True)
class Pending:
    kind: str  # load | store | promotion | cascade
    transfers: float
    oldest_s: float


@dataclass(frozen=True)
class InFlight:
    rank: str
    direction: str
    transfers: float


@dataclass(frozen=True)
class LateRank:
    rank: str
    behind_s: float  # seconds its last report is behind the newest rank's


@dataclass(frozen=True)
class PendingFacts(Facts):
    pending: tuple[Pending, ...]  # kinds pending past the threshold
    threshold_s: float  # --stuck-after
    vllm_running: float | None  # vLLM's own gauges; None: not exported
    vllm_waiting: float | None
    in_flight: tuple[InFlight, ...]  # per-rank transfers in flight
    late_ranks: tuple[LateRank, ...]  # ranks that stopped reporting
    recent_steps: float  # empty steps in the recent span
    recent_span_s: float

    def lines(self) -> list[str]:
        lines = [
            f"{n(p.transfers)} {p.kind} transfer{'s' if p.transfers != 1 else ''} pending, oldest "
            f"{secs(p.oldest_s)} (threshold {secs(self.threshold_s)}, --stuck-after)"
            for p in self.pending
        ]
        lines.append(idle_line(self.vllm_running, self.vllm_waiting))
        if self.in_flight:
            lines.append("in flight: " + ", ".join(
                f"rank {f.rank} {f.direction} ({n(f.transfers)})" for f in self.in_flight))
        if self.late_ranks:
            lines.append("ranks that stopped reporting: " + ", ".join(
                f"rank {r.rank} ({secs(r.behind_s)} behind)" for r in self.late_ranks))
        if self.recent_steps > 0:
            lines.append(f"the engine keeps stepping: +{n(self.recent_steps)} empty steps in the "
                         f"last {secs(self.recent_span_s)}")
        return lines


def idle_line(running: float | None, waiting: float | None) -> str:
    """"nothing runs or waits: ..." with vLLM's own gauges where exported."""
    idle = "nothing runs or waits: kvscope in-flight requests 0"
    if running is not None or waiting is not None:
        idle += f", vLLM running {n(running or 0)}, waiting {n(waiting or 0)}"
    return idle


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    stuck = {
        k: (q, ev.pending.oldest_seconds.get(k))
        for k, q in ev.pending.transfers.items()
        if q.last > 0
    }
    stuck = {
        k: (q, age) for k, (q, age) in stuck.items()
        if age is not None and age.present and age.last >= th.pending_after_s
    }
    if not stuck or not ev.idle:
        return None
    r = ev.requests
    in_flight = tuple(
        InFlight(rank, d, q.last)
        for rank, rt in ev.ranks.items()
        for d, q in rt.in_flight.items()
        if q.last > 0
    )
    late: tuple[LateRank, ...] = ()
    reports = {rk: rt.last_report for rk, rt in ev.ranks.items() if rt.last_report.present}
    if len(reports) > 1:
        newest = max(q.last for q in reports.values())
        late = tuple(LateRank(rk, newest - q.last) for rk, q in reports.items()
                     if newest - q.last >= th.pending_after_s)
    facts = PendingFacts(
        pending=tuple(Pending(k, q.last, age.last) for k, (q, age) in stuck.items()),
        threshold_s=th.pending_after_s,
        vllm_running=r.vllm_running.last if r.vllm_running.present else None,
        vllm_waiting=r.vllm_waiting.last if r.vllm_waiting.present else None,
        in_flight=in_flight,
        late_ranks=late,
        recent_steps=ev.freshness.steps.recent,
        recent_span_s=ev.source.recent_span,
    )
    conf = 0.8 + (0.1 if in_flight else 0)
    where = [(f.rank, f.direction) for f in in_flight] or [(rk.rank, "?") for rk in late]
    causes = "; ".join(_NEXT[k] for k in stuck if k in _NEXT)
    target = ""
    if where:
        target = " Look at " + ", ".join(
            f"rank {rk}" + (f" ({d})" if d != "?" else "") for rk, d in where
        ) + " first."
    marks = []
    for k, (q, age) in stuck.items():
        if q.samples:
            t_end = q.samples[-1][0]
            marks.append(Mark("pending", t_end - age.last, f"{k} stuck since"))
    return Finding(
        id=ID,
        title=TITLE,
        confidence=min(conf, 0.95),
        facts=facts,
        next_step=f"Likely: {causes}.{target} Check that worker's process and log, and the fs "
        "tier's disk; the pending job keeps the engine stepping and its rows pinned.",
        severity=SEVERITY,
        marks=marks,
        uses_gauges=True,
    )
