"""Capacity ceiling, concurrency form.

Each long prefix fits the CPU primary tier alone, but requests restoring at the
same time need more rows together than it has: the first ones promote and pin
their rows, the next one's promotion finds no free row and its restore is cut
(often to 0: recomputed from scratch) although the disk tier holds its prefix.
A tier sized for one request is undersized for the concurrency it serves.
"""

from __future__ import annotations

import math

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Finding, Mark
from ..thresholds import Thresholds
from ._common import bytes_for, ceiling_group_lines, n, window_word
from .capacity_ceiling_truncated import coverage_lines

ID = "capacity_ceiling_concurrency"
TITLE = "Capacity ceiling (concurrency form)"
SEVERITY = 81
CHECK = ("restores cut at the row ceiling although each prefix fits the primary tier alone "
         "(capacity ceiling, concurrency form)")
NEEDS = (S.RESTORE_SHORT_ROUNDS, S.RESTORE_CEILING_ROUNDS, S.RESTORE_HELD_TOKENS, S.PRIMARY_ROWS)
EXPLAINS = frozenset({"rounds", "coverage"})


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
    w = window_word(ev)
    lines = [
        f"{n(cut)} ended lookup round{'s' if cut != 1 else ''} {w} offered less than the tiers "
        "held: a promotion found no free primary row although the request's held prefix fits "
        "the primary tier alone",
    ]
    per = int(need.min) if need.present and 0 < need.min <= rows else 0
    if per:
        lines.append(f"the cut request's held prefix needs {n(per)} rows at once: it fits the "
                     f"{n(rows)}-row primary tier alone")
    if reqs.present and reqs.max >= 2 and together.present:
        lines.append(f"up to {n(reqs.max)} requests were restoring at once, needing about "
                     f"{n(together.max)} rows together (primary tier: {n(rows)})")
    else:
        lines.append("the rows were pinned by other work at the time (other restores or "
                     "in-flight stores)")
    if c.ceiling_offered.present and c.ceiling_held.present and c.ceiling_held.last > 0:
        lines.append(f"latest cut round: {n(c.ceiling_offered.last)} tokens offered of "
                     f"{n(c.ceiling_held.last)} held")
    lines += ceiling_group_lines(ev)
    lines += coverage_lines(ev)
    conf = 0.8
    if ev.tiers.promotion(S.PromotionResult.NO_ROW).increase > 0:
        conf += 0.05
        lines.append(f"{n(ev.tiers.promotion(S.PromotionResult.NO_ROW).increase)} promotions "
                     "found no free row")
    target = together.max if together.present and together.max > rows else rows + max(per, 1)
    want = math.ceil(target * (1 + th.row_margin) - 1e-9)
    fit = max(int(rows // per), 1) if per > 0 else 1
    step = (f"Grow the CPU primary tier to ≥ {want} rows (now {n(rows)}; concurrent restores "
            f"need ≈{n(target)} rows together; + {th.row_margin:.0%} margin)"
            + bytes_for(want, ev, th)
            + (f". Or admit at most {fit} such long-prefix request{'s' if fit != 1 else ''} at "
               f"once ({n(rows)} rows / {per} per request)." if per else "."))
    marks = []
    if c.ceiling_concurrent_rows.samples:
        marks.append(Mark("rounds", c.ceiling_concurrent_rows.samples[-1][0],
                          "concurrent restores over rows"))
    return Finding(id=ID, title=TITLE, confidence=min(conf, 0.95), evidence=lines,
                   next_step=step, severity=SEVERITY, marks=marks, uses_gauges=True)
