"""Queue wait: requests wait for the scheduler, not for the offload tiers.

vLLM reaches the connector's lookup only after running requests used the token
budget and max_num_seqs allows another; until then no lookup is issued. Must not
be reported as a restore failure.
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Finding, Mark
from ..thresholds import Thresholds
from ._common import n, persistently_positive, secs, window_word

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
    lines: list[str] = []
    span = ev.source.recent_span
    waiting = False
    if persistently_positive(queued, ev):
        waiting = True
        lines.append(f"{n(queued.last)} requests queued (not admitted) throughout the last {secs(span)}")
    vllm_confirms = False
    by_reason = req.vllm_waiting_by_reason
    capacity = by_reason.get(_CAPACITY_REASON)
    if capacity is not None and persistently_positive(capacity, ev):
        waiting = vllm_confirms = True
    elif persistently_positive(req.vllm_waiting, ev) and not connector_holds:
        # vLLM has requests waiting and the connector holds none of them: they
        # wait for admission whatever vLLM's reason label says.
        waiting = vllm_confirms = True
    if req.vllm_waiting.present or by_reason:
        parts = [f"{n(req.vllm_waiting.last)} waiting"] if req.vllm_waiting.present else []
        if by_reason:
            parts.append("by reason " + ", ".join(
                f"{k}={n(q.last)}" for k, q in sorted(by_reason.items())))
        if req.vllm_running.present:
            parts.append(f"{n(req.vllm_running.last)} running")
        lines.append("vLLM (" + S.VLLM_REQUESTS_WAITING + "): " + "; ".join(parts))
        deferred_label = by_reason.get(_CONNECTOR_REASON)
        if deferred_label is not None and deferred_label.last > 0 and not connector_holds:
            lines.append(
                f"vLLM's reason=deferred ({n(deferred_label.last)}) is its skipped-waiting queue "
                "(an earlier connector deferral put them there); kvscope: 0 requests deferred or "
                "loading now, so they wait for a running slot / token budget, not for the connector"
            )
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
    conf = 0.7
    if not_issued:
        lines.append(f"no lookup round issued for them in the last {secs(span)}")
    if hits.increase > 0:
        conf += 0.1
        lines.append(
            f"restore path healthy when it runs: {n(hits.increase)} hit rounds {window_word(ev)}, "
            f"{n(r.hit_tokens.increase)} tokens offered, 0 refused loads, 0 rounds at the row ceiling"
        )
    else:
        lines.append("restore path not failing: 0 refused loads, 0 rounds at the row ceiling, no stuck loads")
    mq = req.mean_queue_seconds
    if mq is not None:
        lines.append(f"vLLM mean queue time {secs(mq)} over {n(req.vllm_queue_time_count.increase)} requests")
    if vllm_confirms:
        conf += 0.1
    marks = [Mark("requests", queued.samples[-1][0], "queued")] if queued.samples else []
    return Finding(
        id=ID,
        title=TITLE,
        confidence=min(conf, 0.95),
        evidence=lines,
        next_step=(
            "Not a restore failure: the scheduler has not admitted these requests yet (token "
            "budget / max_num_seqs). Add capacity (replicas, max_num_seqs, max_num_batched_tokens "
            "if memory allows); the offload tier serves them once admitted."
        ),
        severity=SEVERITY,
        marks=marks,
        uses_gauges=True,
    )
