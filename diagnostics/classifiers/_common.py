"""Helpers shared by classifiers: number formatting and the row-count estimate."""

from __future__ import annotations

import math
import re

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Quantity
from ..thresholds import Thresholds


def n(x: float) -> str:
    """A count as an operator reads it: 12, 1,234, 0.5."""
    if abs(x - round(x)) < 1e-9:
        return f"{int(round(x)):,}"
    return f"{x:,.2f}".rstrip("0").rstrip(".")


def nbytes(x: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} TiB"


def secs(x: float) -> str:
    if x < 120:
        return f"{x:.0f} s" if x >= 10 else f"{x:.1f} s"
    if x < 7200:
        return f"{x / 60:.0f} min"
    return f"{x / 3600:.1f} h"


def window_word(ev: Evidence) -> str:
    """How to say "over the window" for this source."""
    return "since process start" if ev.source.lifetime else "in the window"


def persistently_positive(q: Quantity, ev: Evidence) -> bool:
    """Above zero on every sample of the recent span (both scrapes, for a scrape)."""
    if not q.present or q.last <= 0:
        return False
    since = ev.source.end - ev.source.recent_span - 1e-6
    recent = [v for t, v in q.samples if t >= since]
    return bool(recent) and min(recent) > 0


_ROW_BYTES = re.compile(r"row_bytes[=:](\d+)")


def row_bytes(ev: Evidence, th: Thresholds) -> int | None:
    if th.row_bytes:
        return th.row_bytes
    for t in ev.targets:
        if m := _ROW_BYTES.search(t.spec):
            return int(m.group(1))
    # Disk <-> CPU jobs move whole rows (rank="manager"): bytes per key = row bytes.
    mgr = ev.ranks.get(S.RANK_MANAGER)
    if mgr is not None:
        pairs = (
            (S.Direction.DISK_TO_CPU, ev.tiers.promotion(S.PromotionResult.COMPLETED).increase),
            (S.Direction.CPU_TO_DISK, ev.tiers.cascade(S.CascadeResult.COMPLETED).increase),
        )
        for d, keys in pairs:
            q = mgr.bytes.get(d.value)
            if q is not None and q.increase > 0 and keys > 0:
                return int(round(q.increase / keys))
    return None


def rows_needed(ev: Evidence, th: Thresholds) -> tuple[int, str]:
    """Rows one request needs resident at once, plus margin, and how it was estimated.

    Lookups per group per round approximate the chunks of a restored prefix
    (a group that breaks early under-counts, so the busiest group is taken for
    every group). Never less than the current row count + 1: at the ceiling the
    pending-key sum is pinned at the row count, so the true need is above it.
    """
    rows = ev.primary_rows
    rounds = ev.rounds.total
    groups = max(len(ev.lookups), len(ev.kv_groups), 1)
    per_group = max((g.total / rounds for g in ev.lookups.values()), default=0.0) if rounds else 0.0
    keys = max(math.ceil(per_group * groups - 1e-9), int(rows) + 1)
    need = math.ceil(keys * (1 + th.row_margin))
    how = (
        f"≈{n(per_group)} keys per group per round × {groups} groups = {keys} keys resident at once"
        if per_group * groups >= rows + 1
        else f"more than the {n(rows)} rows the pending-key sum is pinned at"
    )
    how += f", + {th.row_margin:.0%} margin"
    rb = row_bytes(ev, th)
    tail = (
        f" — cpu_bytes_to_use ≥ {nbytes(need * rb)} ({need} rows × {nbytes(rb)} per row)"
        if rb
        else " (row bytes unknown: cpu_bytes_to_use = rows × row bytes; pass --row-bytes to get bytes)"
    )
    return need, f"grow the CPU primary tier to ≥ {need} rows (now {n(rows)}; {how}){tail}"


def group_lines(ev: Evidence) -> list[str]:
    out = []
    for g in ev.lookups.values():
        parts = [f"{n(q.increase)} {r}" for r, q in g.results.items() if q.increase > 0]
        if parts:
            out.append(f"kv_group {g.group} lookups: " + ", ".join(parts))
    return out


V = S.Verdict
"""Shorthands classifiers use."""
