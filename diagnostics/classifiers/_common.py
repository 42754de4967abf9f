"""Helpers shared by classifiers: number formatting and the row-count estimate."""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
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


def row_bytes(ev: Evidence, th: Thresholds) -> tuple[int, str] | None:
    """Bytes of one primary-tier row and where that number came from."""
    if th.row_bytes:
        return th.row_bytes, "--row-bytes"
    q = ev.tiers.row_bytes
    if q.present and q.last > 0:
        return int(q.last), S.PRIMARY_ROW_BYTES.name
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
                return int(round(q.increase / keys)), "disk-tier bytes per key"
    return None


def request_keys(ev: Evidence, verdicts: tuple[S.Verdict, ...]) -> tuple[int, S.Verdict] | None:
    """The most chunk keys a vetoed/deferred round's request covered over the window.

    ``kvscope_last_round_request_keys`` is the latest round's count; its max over
    the window is the largest request the tier had to restore at once.
    """
    best = None
    for v in verdicts:
        q = ev.rounds.request_keys(v)
        if q.present and q.max > 0 and (best is None or q.max > best[0]):
            best = (int(q.max), v)
    return best


V = S.Verdict
"""Shorthands classifiers use."""
