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

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Finding, Mark
from ..thresholds import Thresholds
from ._common import bytes_for, ceiling_group_lines, n, window_word

ID = "capacity_ceiling_truncated"
TITLE = "Capacity ceiling (truncated form)"
SEVERITY = 79
CHECK = ("restores cut at the row ceiling while the prefix needs more rows than the primary "
         "tier has (capacity ceiling, truncated form)")
NEEDS = (S.RESTORE_SHORT_ROUNDS, S.RESTORE_CEILING_ROUNDS, S.RESTORE_HELD_TOKENS, S.PRIMARY_ROWS)
EXPLAINS = frozenset({"rounds", "coverage"})


def coverage_lines(ev: Evidence) -> list[str]:
    """The window's coverage figure and its shortfall, for both ceiling forms."""
    c, r = ev.coverage, ev.rounds
    w = window_word(ev)
    lines = []
    ratio = c.ratio(r.hit_tokens)
    if ratio is not None:
        lines.append(
            f"restore coverage {ratio:.1%} {w}: {n(r.hit_tokens.increase)} tokens offered of "
            f"{n(c.held_tokens.increase)} the tiers held")
    cut = c.tokens(S.ShortReason.ROW_CEILING).increase + c.tokens(S.ShortReason.GROUP_VETO).increase
    if cut > 0:
        lines.append(f"{n(cut)} tokens held but not offered for want of a free row (recomputed)")
    return lines


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    c = ev.coverage
    rows = ev.primary_rows
    need = c.ceiling_rows_needed
    # Rounds whose held prefix needs more rows at once than the tier has (judged by
    # the connector when each was cut): never restored whole, whatever else runs.
    cut = c.ceiling(S.CeilingForm.ALONE)
    if cut.increase <= 0 or rows <= 0:
        return None
    w = window_word(ev)
    chunk = ev.info_int("chunk_tokens")
    groups = ev.kv_group_count
    offered, held = c.ceiling_offered, c.ceiling_held
    conf = 0.75
    lines = [f"{n(cut.increase)} ended lookup round{'s' if cut.increase != 1 else ''} {w} offered less than the tiers held: a "
             "promotion found no free primary row and vLLM's prefix scan stopped there"]
    if offered.present and held.present and held.last > 0:
        pinned = ""
        if chunk:
            cap = int(rows // groups) * chunk
            pinned = (f"; the rows hold at most {n(rows)} rows / {groups} KV group"
                      f"{'s' if groups != 1 else ''} × {chunk} tokens = {n(cap)} tokens")
            if offered.last <= cap:
                conf += 0.1
        lines.append(f"latest such round: {n(offered.last)} tokens offered of {n(held.last)} held "
                     f"({offered.last / held.last:.0%}){pinned}")
    if need.present and need.max > rows:
        lines.append(f"a full restore of that prefix needs {n(need.max)} rows at once (chunk "
                     f"keys over {groups} KV group{'s' if groups != 1 else ''}); the primary "
                     f"tier has {n(rows)}")
    else:
        lines.append(f"a full restore of the cut prefix needs more rows at once than the "
                     f"{n(rows)} the primary tier has")
    lines += ceiling_group_lines(ev)
    lines += coverage_lines(ev)
    disk = ev.tiers.cascade(S.CascadeResult.COMPLETED)
    if disk.present and disk.last > 0:
        conf += 0.05
        lines.append(f"the disk tier has data: {n(disk.last)} keys cascaded to it")
    pins = need.max if need.present and need.max > rows else rows + 1
    want = math.ceil(pins * (1 + th.row_margin) - 1e-9)
    step = (f"Grow the CPU primary tier to ≥ {want} rows (now {n(rows)}; a full restore of the "
            f"longest held prefix pins {n(pins)} rows at once; + {th.row_margin:.0%} margin)"
            + bytes_for(want, ev, th)
            + ". Until then every restore of such a prefix stops at the row count and the rest "
            "is recomputed; or shorten the shared prefix / offload fewer KV groups.")
    marks = [Mark("rounds", cut.samples[-1][0], "restore cut at rows")] if cut.samples else []
    return Finding(id=ID, title=TITLE, confidence=min(conf, 0.95), evidence=lines,
                   next_step=step, severity=SEVERITY, marks=marks, uses_gauges=True)
