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
from ._common import n, nbytes, window_word

ID = "stale_row_corruption"
TITLE = "Stale-row corruption (per-rank checksum mismatch)"
SEVERITY = 100
CHECK = "promoted-row checksums per rank (stale-row corruption)"
# Worker-side series: scrape every rank (or vLLM's /metrics, which merges them).
NEEDS = (S.ROW_CHECKSUMS, S.LOADS_REFUSED)
EXPLAINS = frozenset({"rounds"})


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    ranks = ev.worker_ranks
    bad = {
        rank: rt for rank, rt in ranks.items()
        if rt.checksum(S.ChecksumOutcome.MISMATCH).increase > 0
        or rt.refusals(S.RefusalReason.CHECKSUM_ERROR).increase > 0
    }
    if not bad:
        return None
    w = window_word(ev)
    policies = ev.checksum_policies
    policy = policies[0] if len(policies) == 1 else ""
    lines = []
    served_ranks, refused_ranks = [], []
    for rank, rt in bad.items():
        mism = rt.checksum(S.ChecksumOutcome.MISMATCH).increase
        ok = rt.checksum(S.ChecksumOutcome.MATCH).increase
        ref = rt.refusals(S.RefusalReason.CHECKSUM_MISMATCH).increase
        err = rt.refusals(S.RefusalReason.CHECKSUM_ERROR).increase
        loaded = rt.bytes.get(S.Direction.CPU_TO_GPU.value)
        line = f"rank {rank}: {n(mism)} of {n(mism + ok)} promoted-row checksums mismatched {w}"
        if err:
            line += f"; {n(err)} load{'s' if err != 1 else ''} refused as unreadable (checksum_error)"
        # Checksums count rows, refusals count load jobs (one job covers many
        # rows). A policy is all-or-nothing per rank: a rank that refused none of
        # its mismatching loads served every one of them.
        if mism > 0 and ref == 0:
            served_ranks.append(rank)
            line += ", 0 loads refused: the mismatching rows were SERVED"
            if loaded is not None and loaded.increase > 0:
                line += f" ({nbytes(loaded.increase)} loaded CPU -> GPU on this rank)"
        elif ref > 0:
            refused_ranks.append(rank)
            line += (f", {n(ref)} load job{'s' if ref != 1 else ''} refused (vLLM recomputed "
                     "those tokens)")
        lines.append(line)
    clean = [
        r for r, rt in ranks.items()
        if r not in bad and rt.checksum(S.ChecksumOutcome.MATCH).increase > 0
    ]
    if clean:
        lines.append(
            "matching checksums only: "
            + ", ".join(f"rank {r} ({n(ranks[r].checksum(S.ChecksumOutcome.MATCH).increase)} rows)"
                        for r in clean)
        )
    if policies:
        pol = f"{S.L_CHECKSUM_POLICY}={'/'.join(policies)} ({S.INFO.name})"
        if served_ranks and policy == "refuse":
            lines.append(
                f"{pol}, yet rank {', '.join(served_ranks)} refused none: observe was in effect "
                "(kvscope degrades refuse to observe where vLLM cannot recompute refused loads, "
                "e.g. several KV groups on vLLM 0.26)"
            )
        elif served_ranks:
            lines.append(f"{pol}: mismatching loads are counted and served")
        else:
            lines.append(f"{pol}: mismatching loads are refused and recomputed")
    quarantined = ev.tiers.quarantined_keys
    if quarantined.present and quarantined.max > 0:
        lines.append(
            f"{n(quarantined.last)} keys quarantined now (max {n(quarantined.max)}): answered MISS "
            "so vLLM recomputes them instead of reloading the same stale rows"
        )
    promos = ev.tiers.promotion(S.PromotionResult.COMPLETED).increase
    conf = 0.85
    if promos > 0:
        conf += 0.1
        lines.append(f"{n(promos)} promotions completed {w} (rows restored from the disk tier)")
    if served_ranks:
        verdict = (
            "Mismatching rows were SERVED: outputs of requests restored since the first mismatch "
            "may be wrong, treat them as suspect. "
        )
        fix = " Use checksum_policy=refuse where vLLM can recompute (single KV group on vLLM 0.26)."
    else:
        verdict = (
            "Every mismatching load was refused and recomputed: answers are correct, the restores "
            "are wasted. "
        )
        fix = ""
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
        "host's view (nnodes > 1 with TieringOffloadingSpec?). Keep tiering single-node and clear "
        "the fs tier's directory." + fix,
        severity=SEVERITY,
        marks=marks,
    )
