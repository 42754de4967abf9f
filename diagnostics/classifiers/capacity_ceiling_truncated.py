"""Capacity ceiling, truncated form.

A shared prefix longer than the CPU primary tier: its restore promotes chunks
until no row is free, the next chunk's promotion is refused, vLLM's prefix scan
stops there and the request is offered at most rows x chunk tokens (often after
a spell of deferrals); the rest is recomputed although the disk tier holds it.
Output is identical, the hit counters look fine: only held vs offered tokens
(``kvscope_restore_*``) show it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n
from .shared_facts import (
    CeilingGroups,
    Coverage,
    RowBytes,
    bytes_for,
    read_row_bytes,
    window_phrase,
)

ID = "capacity_ceiling_truncated"
TITLE = "Capacity ceiling (truncated form)"
SEVERITY = 79
CHECK = ("restores cut at the row ceiling while the prefix needs more rows than the primary "
         "tier has (capacity ceiling, truncated form)")
NEEDS = (S.RESTORE_SHORT_ROUNDS, S.RESTORE_CEILING_ROUNDS, S.RESTORE_HELD_TOKENS, S.PRIMARY_ROWS)
EXPLAINS = frozenset({"rounds", "coverage"})


@dataclass(frozen=True)
class TruncatedFacts(Facts):
    lifetime: bool
    cut_rounds: float  # rounds cut at the row ceiling whose prefix needs more rows than exist
    primary_rows: float
    kv_groups: int
    chunk_tokens: int | None  # kvscope_info's chunk_tokens; None: not labelled
    latest_offered_tokens: float | None  # the latest such round; None: not exported
    latest_held_tokens: float | None
    rows_needed: float | None  # rows a full restore of the longest cut prefix pins at once
    ceiling_groups: CeilingGroups
    coverage: Coverage
    disk_keys: float | None  # keys cascaded to the disk tier (latest); None: no disk tier data
    row_margin: float
    rows_wanted: int
    row_bytes: RowBytes | None

    @property
    def tokens_cap(self) -> int | None:
        """Tokens the rows hold at most: rows / KV groups × chunk tokens."""
        return int(self.primary_rows // self.kv_groups) * self.chunk_tokens if self.chunk_tokens else None

    @property
    def rows_pinned(self) -> float:
        """Rows a full restore of the longest held prefix pins (at least rows + 1)."""
        return self.rows_needed if self.rows_needed is not None else self.primary_rows + 1

    def lines(self) -> list[str]:
        w, rows, groups = window_phrase(self.lifetime), self.primary_rows, self.kv_groups
        gs = "s" if groups != 1 else ""
        lines = [f"{n(self.cut_rounds)} ended lookup round{'s' if self.cut_rounds != 1 else ''} "
                 f"{w} offered less than the tiers held: a promotion found no free primary row "
                 "and vLLM's prefix scan stopped there"]
        offered, held = self.latest_offered_tokens, self.latest_held_tokens
        if offered is not None and held is not None:
            pinned = ""
            if self.tokens_cap is not None:
                pinned = (f"; the rows hold at most {n(rows)} rows / {groups} KV group{gs} × "
                          f"{self.chunk_tokens} tokens = {n(self.tokens_cap)} tokens")
            lines.append(f"latest such round: {n(offered)} tokens offered of {n(held)} held "
                         f"({offered / held:.0%}){pinned}")
        if self.rows_needed is not None:
            lines.append(f"a full restore of that prefix needs {n(self.rows_needed)} rows at once "
                         f"(chunk keys over {groups} KV group{gs}); the primary tier has {n(rows)}")
        else:
            lines.append(f"a full restore of the cut prefix needs more rows at once than the "
                         f"{n(rows)} the primary tier has")
        lines += self.ceiling_groups.lines()
        lines += self.coverage.lines()
        if self.disk_keys is not None:
            lines.append(f"the disk tier has data: {n(self.disk_keys)} keys cascaded to it")
        return lines

    def next_step(self) -> str:
        return (f"Grow the CPU primary tier to ≥ {self.rows_wanted} rows (now "
                f"{n(self.primary_rows)}; a full restore of the longest held prefix pins "
                f"{n(self.rows_pinned)} rows at once; + {self.row_margin:.0%} margin)"
                + bytes_for(self.rows_wanted, self.row_bytes)
                + ". Until then every restore of such a prefix stops at the row count and the "
                "rest is recomputed; or shorten the shared prefix / offload fewer KV groups.")


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    c = ev.coverage
    rows = ev.primary_rows
    need = c.ceiling_rows_needed
    # Rounds whose held prefix needs more rows at once than the tier has (judged by
    # the connector when each was cut): never restored whole, whatever else runs.
    cut = c.ceiling(S.CeilingForm.ALONE)
    if cut.increase <= 0 or rows <= 0:
        return None
    offered, held = c.ceiling_offered, c.ceiling_held
    latest = offered.present and held.present and held.last > 0
    disk = ev.tiers.cascade(S.CascadeResult.COMPLETED)
    rows_needed = need.max if need.present and need.max > rows else None
    pins = rows_needed if rows_needed is not None else rows + 1
    facts = TruncatedFacts(
        lifetime=ev.source.lifetime,
        cut_rounds=cut.increase,
        primary_rows=rows,
        kv_groups=ev.kv_group_count,
        chunk_tokens=ev.info_int("chunk_tokens") or None,
        latest_offered_tokens=offered.last if latest else None,
        latest_held_tokens=held.last if latest else None,
        rows_needed=rows_needed,
        ceiling_groups=CeilingGroups.read(ev),
        coverage=Coverage.read(ev),
        disk_keys=disk.last if disk.present and disk.last > 0 else None,
        row_margin=th.row_margin,
        rows_wanted=math.ceil(pins * (1 + th.row_margin) - 1e-9),
        row_bytes=read_row_bytes(ev, th),
    )
    conf = 0.75
    cap = facts.tokens_cap
    if latest and cap is not None and offered.last <= cap:
        conf += 0.1
    if facts.disk_keys is not None:
        conf += 0.05
    marks = [Mark("rounds", cut.samples[-1][0], "restore cut at rows")] if cut.samples else []
    return Finding(id=ID, title=TITLE, confidence=min(conf, 0.95), facts=facts,
                   next_step=facts.next_step(), severity=SEVERITY, marks=marks, uses_gauges=True)
