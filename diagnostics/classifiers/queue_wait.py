"""Queue wait: requests wait for the scheduler, not for the offload tiers.

vLLM reaches the connector's lookup only after running requests used the token
budget and max_num_seqs allows another; until then no lookup is issued. Must not
be reported as a restore failure.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n, persistently_positive, secs
from .shared_facts import window_phrase

ID = "queue_wait"
TITLE = "Queue wait (scheduler admission, not an offload failure)"
SEVERITY = 40
CHECK = "requests waiting for scheduler admission while the restore path is idle or healthy"
NEEDS = (S.REQUESTS, S.LOOKUP_ROUNDS)
EXPLAINS = frozenset()

# vLLM's waiting_by_reason values. "deferred" is vLLM's skipped-waiting queue:
# every request the connector answered None for (an async lookup, a promotion)
# goes there and stays there until the scheduler reaches it again, which it
# does not while running requests fill max_num_seqs or the token budget. So
# "deferred" alone does not say the connector holds a request; kvscope's
# per-request state does (a deferred request not asked again this step is
# queued behind capacity).
_CONNECTOR_REASON = "deferred"
_CAPACITY_REASON = "capacity"


def _vllm_holds_none(ev: Evidence) -> bool:
    """vLLM's own gauges (its /metrics) read no request waiting and none running on every
    sample of the recent span: whatever kvscope's request gauges say, nothing waits for
    admission (kvscope's lag behind the engine's last step, or lost events, not a queue)."""
    req = ev.requests
    gauges = (req.vllm_waiting, req.vllm_running)
    if not all(q.present for q in gauges):
        return False
    since = ev.source.end - ev.source.recent_span - 1e-6
    recent = [v for q in gauges for t, v in q.samples if t >= since]
    return bool(recent) and max(recent) == 0


@dataclass(frozen=True)
class QueueFacts(Facts):
    lifetime: bool
    recent_span_s: float
    queued: float | None  # requests queued (not admitted) throughout the recent span; else None
    vllm_waiting: float | None  # vLLM's own gauges; None: not exported
    vllm_waiting_by_reason: dict[str, float]  # reason -> requests ({} when not exported)
    vllm_running: float | None
    skipped_waiting: float | None  # vLLM's reason=deferred with the connector holding none
    not_issued: bool  # no lookup round issued in the recent span
    hit_rounds: float
    hit_tokens: float
    mean_queue_s: float | None  # vLLM's mean queue time; None: not exported
    queue_time_requests: float

    def lines(self) -> list[str]:
        span = secs(self.recent_span_s)
        lines = []
        if self.queued is not None:
            lines.append(f"{n(self.queued)} requests queued (not admitted) throughout the last {span}")
        by_reason = self.vllm_waiting_by_reason
        if self.vllm_waiting is not None or by_reason:
            parts = [f"{n(self.vllm_waiting)} waiting"] if self.vllm_waiting is not None else []
            if by_reason:
                parts.append("by reason " + ", ".join(f"{k}={n(v)}" for k, v in by_reason.items()))
            if self.vllm_running is not None:
                parts.append(f"{n(self.vllm_running)} running")
            lines.append("vLLM (" + S.VLLM_REQUESTS_WAITING + "): " + "; ".join(parts))
            if self.skipped_waiting is not None:
                lines.append(
                    f"vLLM's reason=deferred ({n(self.skipped_waiting)}) is its skipped-waiting "
                    "queue (an earlier connector deferral put them there); kvscope: 0 requests "
                    "deferred or loading now, so they wait for a running slot / token budget, "
                    "not for the connector"
                )
        if self.not_issued:
            lines.append(f"no lookup round issued for them in the last {span}")
        if self.hit_rounds > 0:
            lines.append(
                f"restore path healthy when it runs: {n(self.hit_rounds)} hit rounds "
                f"{window_phrase(self.lifetime)}, {n(self.hit_tokens)} tokens offered, 0 refused "
                "loads, 0 rounds at the row ceiling"
            )
        else:
            lines.append("restore path not failing: 0 refused loads, 0 rounds at the row "
                         "ceiling, no stuck loads")
        if self.mean_queue_s is not None:
            lines.append(f"vLLM mean queue time {secs(self.mean_queue_s)} over "
                         f"{n(self.queue_time_requests)} requests")
        return lines


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    req = ev.requests
    if _vllm_holds_none(ev):
        return None
    queued = req.get(S.RequestState.QUEUED)
    # Requests the connector holds now: deferred (lookup answered None) or
    # loading (async load in flight; vLLM also counts those as waiting).
    connector_holds = any(
        req.get(st).present and req.get(st).last > 0
        for st in (S.RequestState.DEFERRED, S.RequestState.LOADING)
    )
    waiting = queued_throughout = persistently_positive(queued, ev)
    vllm_confirms = False
    by_reason = req.vllm_waiting_by_reason
    capacity = by_reason.get(_CAPACITY_REASON)
    if capacity is not None and persistently_positive(capacity, ev):
        waiting = vllm_confirms = True
    elif persistently_positive(req.vllm_waiting, ev) and not connector_holds:
        # vLLM has requests waiting and the connector holds none of them: they
        # wait for admission whatever vLLM's reason label says.
        waiting = vllm_confirms = True
    if not waiting:
        return None

    r = ev.rounds
    ceiling = r.ceiling(S.Verdict.VETOED).increase + r.ceiling(S.Verdict.DEFERRED).increase
    refused = sum(q.increase for rk in ev.ranks.values() for q in rk.refused.values())
    stuck_loads = ev.pending.oldest(S.PendingKind.LOAD).last >= th.pending_after_s
    if ceiling > 0 or refused > 0 or stuck_loads:
        return None  # the restore path itself is unhealthy: other verdicts own this
    not_issued = r.total == 0 or sum(q.recent for q in r.verdicts.values()) == 0
    hits = r.get(S.Verdict.HIT)
    loading = req.get(S.RequestState.LOADING)
    hit_not_loaded = hits.increase > 0 and (not loading.present or loading.last == 0) and (
        ev.pending.get(S.PendingKind.LOAD).last == 0
    )
    if not (not_issued or hit_not_loaded):
        return None
    deferred_label = by_reason.get(_CONNECTOR_REASON)
    skipped = deferred_label is not None and deferred_label.last > 0 and not connector_holds
    mq = req.mean_queue_seconds
    facts = QueueFacts(
        lifetime=ev.source.lifetime,
        recent_span_s=ev.source.recent_span,
        queued=queued.last if queued_throughout else None,
        vllm_waiting=req.vllm_waiting.last if req.vllm_waiting.present else None,
        vllm_waiting_by_reason={k: q.last for k, q in sorted(by_reason.items())},
        vllm_running=req.vllm_running.last if req.vllm_running.present else None,
        skipped_waiting=deferred_label.last if skipped else None,
        not_issued=not_issued,
        hit_rounds=hits.increase,
        hit_tokens=r.hit_tokens.increase,
        mean_queue_s=mq,
        queue_time_requests=req.vllm_queue_time_count.increase,
    )
    conf = 0.7
    if hits.increase > 0:
        conf += 0.1
    if vllm_confirms:
        conf += 0.1
    marks = [Mark("requests", queued.samples[-1][0], "queued")] if queued.samples else []
    return Finding(
        id=ID,
        title=TITLE,
        confidence=min(conf, 0.95),
        facts=facts,
        next_step=(
            "Not a restore failure: the scheduler has not admitted these requests yet (token "
            "budget / max_num_seqs). Add capacity (replicas, max_num_seqs, max_num_batched_tokens "
            "if memory allows); the offload tier serves them once admitted."
        ),
        severity=SEVERITY,
        marks=marks,
        uses_gauges=True,
    )
