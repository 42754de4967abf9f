"""Capacity ceiling, veto form.

A restore needs more keys resident at once than the CPU primary tier has rows:
promotions pin every row, the next key answers MISS, a group that misses at
its first key vetoes the cross-group AND, and the request gets 0 tokens although
the disk tier holds its prefix.
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Finding, Mark
from ..thresholds import Thresholds
from ._common import group_lines, n, rows_needed, stopping_groups_line, window_word

ID = "capacity_ceiling_veto"
TITLE = "Capacity ceiling (veto form)"
SEVERITY = 80
CHECK = "vetoed rounds at the primary-tier row ceiling (capacity ceiling, veto form)"
NEEDS = (S.LOOKUP_ROUNDS, S.ROUNDS_AT_ROW_CEILING, S.PRIMARY_ROWS)
EXPLAINS = frozenset({"rounds", "coverage"})


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    r = ev.rounds
    vetoed = r.get(S.Verdict.VETOED)
    at_ceiling = r.ceiling(S.Verdict.VETOED)
    rows = ev.primary_rows
    pk = r.pending_keys(S.Verdict.VETOED)
    pinned = pk.present and rows > 0 and pk.max >= rows
    # A vetoed request covering more chunk keys than the tier has rows can never
    # be restored whole; with promotions that found no free row, the tier ran
    # out while restoring: the capacity ceiling, even if no round was counted at
    # the ceiling (the pending-key sum of the vetoing round can be below it).
    rk = r.request_keys(S.Verdict.VETOED)
    no_row = ev.tiers.promotion(S.PromotionResult.NO_ROW).increase
    too_big = rk.present and rows > 0 and rk.max > rows and no_row > 0
    if vetoed.increase <= 0 or not (at_ceiling.increase > 0 or pinned or too_big):
        return None
    hits = r.get(S.Verdict.HIT).increase
    disk = ev.tiers.cascade(S.CascadeResult.COMPLETED)
    w = window_word(ev)

    conf = 0.55
    lines = []
    if at_ceiling.increase > 0:
        conf += 0.15
        lines.append(
            f"{n(at_ceiling.increase)} of {n(vetoed.increase)} vetoed rounds {w} reached the row "
            f"ceiling (pending-key sum ≥ {n(rows)} primary rows)"
        )
    else:
        lines.append(f"{n(vetoed.increase)} vetoed rounds {w}")
    if pinned:
        conf += 0.05
        lines.append(
            f"pending-key sum of the latest vetoed round: {n(pk.last)} (max {n(pk.max)}) vs "
            f"{n(rows)} primary rows"
        )
    if rk.present and rk.max > 0:
        per = f" ({n(rk.max / ev.kv_group_count)} per KV group × {ev.kv_group_count})" \
            if ev.kv_group_count > 1 else ""
        lines.append(
            f"the vetoed request covers {n(rk.max)} chunk keys{per}: a full restore needs "
            f"{n(rk.max)} rows at once, the tier has {n(rows)}"
        )
        if rk.max > rows:
            conf += 0.05
    if hits == 0:
        conf += 0.15
        lines.append(f"0 hit rounds {w}: {n(r.hit_tokens.increase)} tokens offered to load")
    else:
        lines.append(f"{n(hits)} hit rounds {w} (some restores still fit)")
    if disk.last > 0:
        conf += 0.1
        lines.append(f"the disk tier has data: {n(disk.last)} keys cascaded to it")
    if no_row > 0:
        lines.append(f"{n(no_row)} promotions found no free row (primary tier full)")
    group = stopping_groups_line(ev, S.ShortReason.GROUP_VETO,
                                 "its miss gave the cross-group AND 0 tokens")
    if group:
        lines.append(group)
    lines += group_lines(ev)
    q = ev.vllm.external_queries
    if q.present and q.increase > 0:
        lines.append(
            f"vLLM external prefix cache: {n(ev.vllm.external_hits.increase)} hits of "
            f"{n(q.increase)} queried tokens"
        )
    _, step = rows_needed(ev, th)
    marks = [Mark("rounds", t, "veto at ceiling") for t in _rise(at_ceiling.samples)[:1]]
    return Finding(
        id=ID,
        title=TITLE,
        confidence=min(conf, 0.98),
        evidence=lines,
        next_step=step[0].upper() + step[1:]
        + ". Or restore less per request (fewer offloaded groups, shorter shared prefix).",
        severity=SEVERITY,
        marks=marks,
    )


def _rise(samples) -> list[float]:
    """Times where a series went up."""
    return [t for (t0, v0), (t, v) in zip(samples, samples[1:], strict=False) if v > v0]
