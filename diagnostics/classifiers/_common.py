"""Helpers shared by classifiers: number formatting and the row-count estimate."""

from __future__ import annotations

import math

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


def bytes_for(rows: int, ev: Evidence, th: Thresholds) -> str:
    """' - cpu_bytes_to_use >= ...' for ``rows`` rows, or how to get bytes."""
    rb = row_bytes(ev, th)
    if rb is None:
        return (" (row bytes unknown: cpu_bytes_to_use = rows × row bytes; pass --row-bytes "
                "to get bytes)")
    b, where = rb
    return (f" — cpu_bytes_to_use ≥ {rows * b} ({nbytes(rows * b)} = {rows} rows × "
            f"{nbytes(b)} per row, {where})")


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


def rows_needed(
    ev: Evidence, th: Thresholds, verdicts: tuple[S.Verdict, ...] = (S.Verdict.VETOED,)
) -> tuple[int, str]:
    """Rows the primary tier needs, with margin, and the next-step sentence.

    A restore pins one row per chunk key of every KV group of the request until
    it is loaded, so a request restores only if the tier holds all its keys at
    once: ``kvscope_last_round_request_keys`` is that count, exactly. Never less
    than the current row count + 1: at the ceiling the tier was short by
    definition (a request that alone fits lost rows to concurrent restores or
    stores). Without that series (a relabel rule dropped it) only the lower bound
    is known, and the sentence says so.
    """
    rows = ev.primary_rows
    groups = ev.kv_group_count
    rk = request_keys(ev, verdicts)
    if rk is not None:
        keys, v = rk
        if keys > rows:
            how = (f"the {v.value} request covers {keys} chunk keys over {groups} KV group"
                   f"{'s' if groups != 1 else ''}, all resident at once for a restore")
        else:
            how = (f"the {v.value} request alone covers {keys} keys ≤ {n(rows)} rows: concurrent "
                   "restores and stores held the rest")
        keys = max(keys, int(rows) + 1)
    else:
        keys = int(rows) + 1
        how = (f"more than the {n(rows)} rows the pending-key sum is pinned at; how many more is "
               f"unknown: {S.LAST_ROUND_REQUEST_KEYS.name} is missing")
    need = math.ceil(keys * (1 + th.row_margin) - 1e-9)
    how += f"; + {th.row_margin:.0%} margin"
    return need, (f"grow the CPU primary tier to ≥ {need} rows (now {n(rows)}; {how})"
                  + bytes_for(need, ev, th))


def group_lines(ev: Evidence) -> list[str]:
    out = []
    for g in ev.lookups.values():
        parts = [f"{n(q.increase)} {r}" for r, q in g.results.items() if q.increase > 0]
        if parts:
            out.append(f"kv_group {g.group} lookups: " + ", ".join(parts))
    return out


V = S.Verdict
"""Shorthands classifiers use."""


def stopping_groups_line(ev: Evidence, reason: S.ShortReason, what: str) -> str | None:
    """Which KV group's scan stopped the rounds cut short for ``reason`` (e.g. "the offer
    stopped in KV group 0 (full_attention) in 1 round: <what>"), when the model has several
    groups and the input tells (``kvscope_restore_stopped_rounds_total``)."""
    if ev.kv_group_count < 2:
        return None
    groups = ev.stopping_groups(reason)
    if not groups:
        return None
    named = ", ".join(f"KV group {g}" + (f" ({kind})" if kind else "")
                      + f" in {n(k)} round{'s' if k != 1 else ''}" for g, kind, k in groups)
    return f"the offer stopped in {named}: {what}"


def ceiling_group_lines(ev: Evidence) -> list[str]:
    """The KV groups that stopped offers the row ceiling cut: a promotion without a free
    row, or (several groups) a group whose miss, a promotion refused, vetoed the rest."""
    lines = [stopping_groups_line(ev, S.ShortReason.ROW_CEILING,
                                  "its next chunk's promotion found no free row"),
             stopping_groups_line(ev, S.ShortReason.GROUP_VETO,
                                  "its miss gave the cross-group AND 0 tokens")]
    return [line for line in lines if line]
