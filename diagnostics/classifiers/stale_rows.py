"""Stale-row corruption: a restored row differs between rank slots.

A promotion writes the whole row (every rank slot) from the scheduler host's
view; a rank whose slot lives elsewhere (another host) loads bytes it never
wrote. The worker compares each promoted row's checksum before a CPU->GPU load.
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Finding, Mark
from ..thresholds import Thresholds
from ._common import n, window_word

ID = "stale_row_corruption"
TITLE = "Stale-row corruption (per-rank checksum mismatch)"
SEVERITY = 100
CHECK = "promoted-row checksums per rank (stale-row corruption)"


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    bad = {
        rank: rt for rank, rt in ev.ranks.items()
        if rt.checksum(S.ChecksumOutcome.MISMATCH).increase > 0
        or rt.refusals(S.RefusalReason.CHECKSUM_ERROR).increase > 0
    }
    if not bad:
        return None
    w = window_word(ev)
    lines = []
    mism_total = refused_total = 0.0
    for rank, rt in bad.items():
        mism = rt.checksum(S.ChecksumOutcome.MISMATCH).increase
        ok = rt.checksum(S.ChecksumOutcome.MATCH).increase
        ref = rt.refusals(S.RefusalReason.CHECKSUM_MISMATCH).increase
        err = rt.refusals(S.RefusalReason.CHECKSUM_ERROR).increase
        mism_total += mism
        refused_total += ref
        line = f"rank {rank}: {n(mism)} of {n(mism + ok)} promoted-row checksums mismatched {w}"
        line += f", {n(ref)} loads refused"
        if err:
            line += f", {n(err)} refused as unreadable (checksum_error)"
        lines.append(line)
    clean = [
        r for r, rt in ev.ranks.items()
        if r not in bad and rt.checksum(S.ChecksumOutcome.MATCH).increase > 0
    ]
    if clean:
        lines.append("ranks with matching checksums only: " + ", ".join(clean))
    promos = ev.tiers.promotion(S.PromotionResult.COMPLETED).increase
    conf = 0.85
    if promos > 0:
        conf += 0.1
        lines.append(f"{n(promos)} promotions completed {w} (rows restored from the disk tier)")
    served = mism_total - refused_total
    if served > 0:
        lines.append(
            f"{n(served)} mismatching loads were SERVED (policy observe): outputs since may be wrong"
        )
        verdict = "Mismatching rows were served: treat outputs since the first mismatch as suspect. "
    else:
        lines.append("every mismatching load was refused: vLLM recomputed those tokens (answers correct, restores wasted)")
        verdict = ""
    marks = []
    for rank, rt in bad.items():
        q = rt.checksum(S.ChecksumOutcome.MISMATCH)
        rises = [t for (t0, v0), (t, v) in zip(q.samples, q.samples[1:], strict=False) if v > v0]
        if rises or q.samples:
            marks.append(Mark("checksums", (rises or [q.samples[-1][0]])[0], f"rank {rank} mismatch"))
    return Finding(
        id=ID,
        title=TITLE,
        confidence=min(conf, 0.99),
        evidence=lines,
        next_step=verdict
        + "Rank slots of restored rows are not what those ranks wrote: the tier's rows are one "
        "host's view (nnodes > 1 with TieringOffloadingSpec?). Keep tiering single-node, clear the "
        "fs tier's directory, and run the checksum policy as enforce.",
        severity=SEVERITY,
        marks=marks,
    )
