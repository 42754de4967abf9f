"""Healthy: no incident class holds; say what was checked and what was seen."""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Finding
from ._common import n, secs, window_word

ID = "healthy"
TITLE = "Healthy"
SEVERITY = 0


def finding(ev: Evidence, checks: list[str]) -> Finding:
    r = ev.rounds
    w = window_word(ev)
    lines = [
        f"{n(r.total)} lookup rounds {w}: "
        + ", ".join(f"{n(r.get(v).increase)} {v.value}" for v in S.Verdict)
        + f"; {n(r.hit_tokens.increase)} tokens offered to load",
    ]
    promos = ev.tiers.promotion(S.PromotionResult.COMPLETED).increase
    casc = ev.tiers.cascade(S.CascadeResult.COMPLETED).increase
    lines.append(
        f"primary tier {n(ev.primary_rows)} rows ({n(ev.tiers.row(S.RowState.OCCUPIED).last)} occupied); "
        f"{n(promos)} promotions, {n(casc)} cascades {w}"
    )
    workers = ev.worker_ranks
    compared = sum(q.increase for rt in workers.values() for q in rt.checksums.values())
    if workers:
        lines.append(f"{len(workers)} rank{'s' if len(workers) != 1 else ''} reporting; {n(compared)} row checksums compared, 0 mismatched")
    age = ev.freshness.newest_age
    if age is not None:
        lines.append(f"last scheduler step {secs(age)} ago" + (" (engine idle)" if ev.idle else ""))
    lines += [f"checked: {c}" for c in checks]
    return Finding(
        id=ID,
        title=TITLE,
        confidence=1.0,
        evidence=lines,
        next_step="Nothing to do.",
        severity=SEVERITY,
    )
