"""Capacity ceiling, veto form.

A restore needs more keys resident at once than the CPU primary tier has rows:
promotions pin every row, the next key answers MISS, a group that misses at
its first key vetoes the cross-group AND, and the request gets 0 tokens although
the disk tier holds its prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n
from .shared_facts import (
    GROUP_VETO,
    GroupLookupCounts,
    RowSizing,
    StoppedGroup,
    group_lines,
    group_lookups,
    stopped_groups,
    stopped_line,
    window_phrase,
)

ID = "capacity_ceiling_veto"
TITLE = "Capacity ceiling (veto form)"
SEVERITY = 80
CHECK = "vetoed rounds at the primary-tier row ceiling (capacity ceiling, veto form)"
NEEDS = (S.LOOKUP_ROUNDS, S.ROUNDS_AT_ROW_CEILING, S.PRIMARY_ROWS)
EXPLAINS = frozenset({"rounds", "coverage"})


@dataclass(frozen=True)
class VetoFacts(Facts):
    lifetime: bool
    vetoed_rounds: float
    rounds_at_ceiling: float  # vetoed rounds whose pending-key sum reached the rows
    primary_rows: float
    pending_keys_last: float | None  # the latest vetoed round's pending-key sum; None: absent
    pending_keys_max: float | None
    request_keys: float | None  # chunk keys of the largest vetoed request; None: unknown
    kv_groups: int
    hit_rounds: float
    hit_tokens: float
    disk_keys: float  # keys cascaded to the disk tier (latest)
    promotions_no_row: float
    stopped_by_veto: tuple[StoppedGroup, ...]
    lookups: tuple[GroupLookupCounts, ...]
    external_hit_tokens: float | None  # vLLM's external prefix cache; None: not queried
    external_queried_tokens: float | None
    sizing: RowSizing

    @property
    def pinned(self) -> bool:
        """The pending-key sum reached the row count."""
        return (self.pending_keys_max is not None and self.primary_rows > 0
                and self.pending_keys_max >= self.primary_rows)

    def lines(self) -> list[str]:
        w, rows = window_phrase(self.lifetime), self.primary_rows
        lines = []
        if self.rounds_at_ceiling > 0:
            lines.append(
                f"{n(self.rounds_at_ceiling)} of {n(self.vetoed_rounds)} vetoed rounds {w} reached "
                f"the row ceiling (pending-key sum ≥ {n(rows)} primary rows)"
            )
        else:
            lines.append(f"{n(self.vetoed_rounds)} vetoed rounds {w}")
        if self.pinned:
            lines.append(
                f"pending-key sum of the latest vetoed round: {n(self.pending_keys_last)} (max "
                f"{n(self.pending_keys_max)}) vs {n(rows)} primary rows"
            )
        if self.request_keys is not None:
            rk, g = self.request_keys, self.kv_groups
            per = f" ({n(rk / g)} per KV group × {g})" if g > 1 else ""
            lines.append(
                f"the vetoed request covers {n(rk)} chunk keys{per}: a full restore needs "
                f"{n(rk)} rows at once, the tier has {n(rows)}"
            )
        if self.hit_rounds == 0:
            lines.append(f"0 hit rounds {w}: {n(self.hit_tokens)} tokens offered to load")
        else:
            lines.append(f"{n(self.hit_rounds)} hit rounds {w} (some restores still fit)")
        if self.disk_keys > 0:
            lines.append(f"the disk tier has data: {n(self.disk_keys)} keys cascaded to it")
        if self.promotions_no_row > 0:
            lines.append(f"{n(self.promotions_no_row)} promotions found no free row (primary "
                         "tier full)")
        lines += stopped_line(self.stopped_by_veto, GROUP_VETO)
        lines += group_lines(self.lookups)
        if self.external_queried_tokens is not None:
            lines.append(
                f"vLLM external prefix cache: {n(self.external_hit_tokens)} hits of "
                f"{n(self.external_queried_tokens)} queried tokens"
            )
        return lines


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
    q = ev.vllm.external_queries
    queried = q.present and q.increase > 0
    facts = VetoFacts(
        lifetime=ev.source.lifetime,
        vetoed_rounds=vetoed.increase,
        rounds_at_ceiling=at_ceiling.increase,
        primary_rows=rows,
        pending_keys_last=pk.last if pk.present else None,
        pending_keys_max=pk.max if pk.present else None,
        request_keys=rk.max if rk.present and rk.max > 0 else None,
        kv_groups=ev.kv_group_count,
        hit_rounds=r.get(S.Verdict.HIT).increase,
        hit_tokens=r.hit_tokens.increase,
        disk_keys=ev.tiers.cascade(S.CascadeResult.COMPLETED).last,
        promotions_no_row=no_row,
        stopped_by_veto=stopped_groups(ev, S.ShortReason.GROUP_VETO),
        lookups=group_lookups(ev),
        external_hit_tokens=ev.vllm.external_hits.increase if queried else None,
        external_queried_tokens=q.increase if queried else None,
        sizing=RowSizing.read(ev, th),
    )
    conf = 0.55
    conf += 0.15 if facts.rounds_at_ceiling > 0 else 0
    conf += 0.05 if facts.pinned else 0
    conf += 0.05 if facts.request_keys is not None and facts.request_keys > rows else 0
    conf += 0.15 if facts.hit_rounds == 0 else 0
    conf += 0.1 if facts.disk_keys > 0 else 0
    step = facts.sizing.sentence()
    marks = [Mark("rounds", t, "veto at ceiling") for t in _rise(at_ceiling.samples)[:1]]
    return Finding(
        id=ID,
        title=TITLE,
        confidence=min(conf, 0.98),
        facts=facts,
        next_step=step[0].upper() + step[1:]
        + ". Or restore less per request (fewer offloaded groups, shorter shared prefix).",
        severity=SEVERITY,
        marks=marks,
    )


def _rise(samples) -> list[float]:
    """Times where a series went up."""
    return [t for (t0, v0), (t, v) in zip(samples, samples[1:], strict=False) if v > v0]
