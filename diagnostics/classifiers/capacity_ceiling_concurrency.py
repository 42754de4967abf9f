"""Capacity ceiling, concurrency form.

Each long prefix fits the CPU primary tier alone, but requests restoring at the
same time need more rows together than it has: the first ones promote and pin
their rows, the next one's promotion finds no free row and its restore is cut
(often to 0: recomputed from scratch) although the disk tier holds its prefix.
A tier sized for one request is undersized for the concurrency it serves.
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

ID = "capacity_ceiling_concurrency"
TITLE = "Capacity ceiling (concurrency form)"
SEVERITY = 81
CHECK = ("restores cut at the row ceiling although each prefix fits the primary tier alone "
         "(capacity ceiling, concurrency form)")
NEEDS = (S.RESTORE_SHORT_ROUNDS, S.RESTORE_CEILING_ROUNDS, S.RESTORE_HELD_TOKENS, S.PRIMARY_ROWS)
EXPLAINS = frozenset({"rounds", "coverage"})


@dataclass(frozen=True)
class ConcurrencyFacts(Facts):
    lifetime: bool
    cut_rounds: float  # rounds cut at the row ceiling whose prefix fits the tier alone
    primary_rows: float
    rows_per_request: int | None  # rows the cut request's held prefix needs; None: unknown
    concurrent_requests: float | None  # most requests restoring at once; None: not told
    concurrent_rows: float | None  # rows those needed together
    latest_offered_tokens: float | None  # the latest cut round; None: not exported
    latest_held_tokens: float | None
    ceiling_groups: CeilingGroups
    coverage: Coverage
    promotions_no_row: float
    row_margin: float
    rows_together: float  # the rows the next step sizes for, before the margin
    rows_wanted: int
    row_bytes: RowBytes | None

    @property
    def admit_at_once(self) -> int | None:
        """Long-prefix requests the rows now hold at once."""
        per = self.rows_per_request
        return max(int(self.primary_rows // per), 1) if per else None

    def lines(self) -> list[str]:
        rows, cut = self.primary_rows, self.cut_rounds
        lines = [
            f"{n(cut)} ended lookup round{'s' if cut != 1 else ''} {window_phrase(self.lifetime)} "
            "offered less than the tiers held: a promotion found no free primary row although "
            "the request's held prefix fits the primary tier alone",
        ]
        if self.rows_per_request:
            lines.append(f"the cut request's held prefix needs {n(self.rows_per_request)} rows at "
                         f"once: it fits the {n(rows)}-row primary tier alone")
        if self.concurrent_requests is not None:
            lines.append(f"up to {n(self.concurrent_requests)} requests were restoring at once, "
                         f"needing about {n(self.concurrent_rows)} rows together (primary tier: "
                         f"{n(rows)})")
        else:
            lines.append("the rows were pinned by other work at the time (other restores or "
                         "in-flight stores)")
        if self.latest_offered_tokens is not None:
            lines.append(f"latest cut round: {n(self.latest_offered_tokens)} tokens offered of "
                         f"{n(self.latest_held_tokens)} held")
        lines += self.ceiling_groups.lines()
        lines += self.coverage.lines()
        if self.promotions_no_row > 0:
            lines.append(f"{n(self.promotions_no_row)} promotions found no free row")
        return lines

    def next_step(self) -> str:
        rows, per, fit = self.primary_rows, self.rows_per_request, self.admit_at_once
        return (f"Grow the CPU primary tier to ≥ {self.rows_wanted} rows (now {n(rows)}; "
                f"concurrent restores need ≈{n(self.rows_together)} rows together; + "
                f"{self.row_margin:.0%} margin)"
                + bytes_for(self.rows_wanted, self.row_bytes)
                + (f". Or admit at most {fit} such long-prefix request{'s' if fit != 1 else ''} "
                   f"at once ({n(rows)} rows / {per} per request)." if per else "."))


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    c = ev.coverage
    rows = ev.primary_rows
    need, together = c.ceiling_rows_needed, c.ceiling_concurrent_rows
    reqs = c.ceiling_concurrent_requests
    # Rounds cut at the row ceiling whose held prefix fits the tier alone (judged by
    # the connector when each was cut): rows pinned by other work took its place.
    cut = c.ceiling(S.CeilingForm.CONCURRENT).increase
    if cut <= 0 or rows <= 0:
        return None
    per = int(need.min) if need.present and 0 < need.min <= rows else 0
    told = reqs.present and reqs.max >= 2 and together.present
    latest = c.ceiling_offered.present and c.ceiling_held.present and c.ceiling_held.last > 0
    no_row = ev.tiers.promotion(S.PromotionResult.NO_ROW).increase
    target = together.max if together.present and together.max > rows else rows + max(per, 1)
    facts = ConcurrencyFacts(
        lifetime=ev.source.lifetime,
        cut_rounds=cut,
        primary_rows=rows,
        rows_per_request=per or None,
        concurrent_requests=reqs.max if told else None,
        concurrent_rows=together.max if told else None,
        latest_offered_tokens=c.ceiling_offered.last if latest else None,
        latest_held_tokens=c.ceiling_held.last if latest else None,
        ceiling_groups=CeilingGroups.read(ev),
        coverage=Coverage.read(ev),
        promotions_no_row=no_row,
        row_margin=th.row_margin,
        rows_together=target,
        rows_wanted=math.ceil(target * (1 + th.row_margin) - 1e-9),
        row_bytes=read_row_bytes(ev, th),
    )
    conf = 0.8 + (0.05 if no_row > 0 else 0)
    marks = []
    if c.ceiling_concurrent_rows.samples:
        marks.append(Mark("rounds", c.ceiling_concurrent_rows.samples[-1][0],
                          "concurrent restores over rows"))
    return Finding(id=ID, title=TITLE, confidence=min(conf, 0.95), facts=facts,
                   next_step=facts.next_step(), severity=SEVERITY, marks=marks, uses_gauges=True)
