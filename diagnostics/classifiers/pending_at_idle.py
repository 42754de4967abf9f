"""Pending at idle: transfers unfinished while nothing runs or waits.

vLLM never idles while transfers are pending: it keeps taking empty steps. A
transfer older than any real one on an otherwise idle engine is stuck (a worker
that never reports, a hung fs thread pool, an unflushed reset fence).
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Finding, Mark
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
    lines = [
        f"{n(q.last)} {k} transfer{'s' if q.last != 1 else ''} pending, oldest {secs(age.last)} "
        f"(threshold {secs(th.pending_after_s)}, --stuck-after)"
        for k, (q, age) in stuck.items()
    ]
    idle = "nothing runs or waits: kvscope in-flight requests 0"
    if r.vllm_running.present or r.vllm_waiting.present:
        idle += (
            f", vLLM running {n(r.vllm_running.last)}, waiting {n(r.vllm_waiting.last)}"
        )
    lines.append(idle)
    where = [
        (rank, d, q.last)
        for rank, rt in ev.ranks.items()
        for d, q in rt.in_flight.items()
        if q.last > 0
    ]
    conf = 0.8
    if where:
        conf += 0.1
        lines.append(
            "in flight: " + ", ".join(f"rank {rk} {d} ({n(c)})" for rk, d, c in where)
        )
    reports = {rk: rt.last_report for rk, rt in ev.ranks.items() if rt.last_report.present}
    if len(reports) > 1:
        newest = max(q.last for q in reports.values())
        late = [rk for rk, q in reports.items() if newest - q.last >= th.pending_after_s]
        if late:
            lines.append(
                "ranks that stopped reporting: "
                + ", ".join(f"rank {rk} ({secs(newest - reports[rk].last)} behind)" for rk in late)
            )
            if not where:
                where = [(rk, "?", 0) for rk in late]
    steps = ev.freshness.steps
    if steps.recent > 0:
        lines.append(f"the engine keeps stepping: +{n(steps.recent)} empty steps in the last {secs(ev.source.recent_span)}")
    causes = "; ".join(_NEXT[k] for k in stuck if k in _NEXT)
    target = ""
    if where:
        target = " Look at " + ", ".join(
            f"rank {rk}" + (f" ({d})" if d != "?" else "") for rk, d, _ in where
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
        evidence=lines,
        next_step=f"Likely: {causes}.{target} Check that worker's process and log, and the fs "
        "tier's disk; the pending job keeps the engine stepping and its rows pinned.",
        severity=SEVERITY,
        marks=marks,
        uses_gauges=True,
    )
