"""Healthy: no incident class holds; say what was checked and what was seen."""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Finding, Unchecked
from ._common import n, secs, window_word

ID = "healthy"
TITLE = "Healthy"
SEVERITY = 0
INCONCLUSIVE_ID = "inconclusive"


def inconclusive(ev: Evidence, unchecked: list[Unchecked], errors: list[Finding],
                 remedies: dict[str, str] | None = None) -> Finding:
    """No incident found by the checks that ran, but not every check ran: not healthy.
    ``remedies``: check id -> its own next step (the window-wide checks), where "make
    the missing series reach this source" is not the remedy."""
    k = len(unchecked) + len(errors)
    lines = [u.line for u in unchecked]
    lines += [f"check {f.id.split(':', 1)[-1]} failed: see its finding" for f in errors]
    lines.append("the checks that ran found no incident: " + _seen(ev)[0])
    step = ("Not healthy: not every check could run. Make the missing series reach this source "
            "(kvscope version on every process, relabel rules that keep kvscope_* series and "
            "their labels, every rank scraped) and run again; until then treat it as unknown.")
    remedies = remedies or {}
    steps = [remedies[u.check] for u in unchecked if u.check in remedies]
    if steps:
        if len(steps) < len(unchecked) or errors:
            steps.append("Then make the missing series reach this source and run again.")
        step = "Not healthy. " + " ".join(steps)
    return Finding(
        id=INCONCLUSIVE_ID,
        title=f"Inconclusive ({k} check{'s' if k != 1 else ''} could not run)",
        confidence=1.0,
        evidence=lines,
        next_step=step,
        severity=SEVERITY,
        kind=INCONCLUSIVE_ID,
    )


def _seen(ev: Evidence) -> list[str]:
    r = ev.rounds
    w = window_word(ev)
    return [
        f"{n(r.total)} lookup rounds {w}: "
        + ", ".join(f"{n(r.get(v).increase)} {v.value}" for v in S.Verdict)
        + f"; {n(r.hit_tokens.increase)} tokens offered to load",
    ]


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
        k, ws = len(workers), ev.info_int(S.L_WORLD_SIZE)
        ranks = (f"{k} of {ws} ranks reporting ({S.INFO.name} {S.L_WORLD_SIZE}={ws})"
                 if ws is not None else
                 f"{k} rank{'s' if k != 1 else ''} reporting (world size unknown: a rank "
                 "missing from every series would not show, see the notes)")
        line = f"{ranks}; {n(compared)} row checksums compared, 0 mismatched"
        shared = ev.tiers.checksum_ranks.get(S.RankCheck.SHARED_REGION.value)
        if shared is not None and shared.present and shared.last:
            k = int(shared.last)
            line += (f" ({k} rank{'s' if k != 1 else ''} on the scheduler's own region file "
                     "read the promoted bytes themselves: nothing to compare)")
        lines.append(line)
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
        kind=ID,
    )
