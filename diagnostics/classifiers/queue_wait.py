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

# vLLM's waiting_by_reason value for connector deferrals (async loads,
# promotions): those are the offload path's waits, judged by other classifiers.
_CONNECTOR_REASON = "deferred"


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    req = ev.requests
    queued = req.get(S.RequestState.QUEUED)
    lines: list[str] = []
    span = ev.source.recent_span
    waiting = False
    if persistently_positive(queued, ev):
        waiting = True
        lines.append(f"{n(queued.last)} requests queued (not admitted) throughout the last {secs(span)}")
    reasons = {
        k: q for k, q in req.vllm_waiting_by_reason.items()
        if k != _CONNECTOR_REASON and persistently_positive(q, ev)
    }
    vllm_confirms = False
    if reasons:
        waiting = vllm_confirms = True
        lines.append(
            "vLLM waiting by reason: "
            + ", ".join(f"{k}={n(q.last)}" for k, q in sorted(reasons.items()))
        )
    elif persistently_positive(req.vllm_waiting, ev) and not req.vllm_waiting_by_reason:
        waiting = vllm_confirms = True
        lines.append(f"vLLM: {n(req.vllm_waiting.last)} requests waiting")
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
