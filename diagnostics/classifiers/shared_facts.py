"""Fact records several classifiers share, each read from the evidence by one function and
rendered by another: the KV groups' lookups, the groups whose scan stopped an offer, the
row-count sizing of the next step, the window's restore coverage."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..thresholds import Thresholds
from ._common import n, nbytes, request_keys, row_bytes


def window_phrase(lifetime: bool) -> str:
    """How to say "over the window" for a source (a scrape's counters are lifetime totals)."""
    return "since process start" if lifetime else "in the window"


@dataclass(frozen=True)
class GroupLookupCounts:
    """One KV group's lookups over the window, by result (those that rose)."""

    group: str
    results: dict[str, float]


def group_lookups(ev: Evidence) -> tuple[GroupLookupCounts, ...]:
    out = []
    for g in ev.lookups.values():
        rose = {r: q.increase for r, q in g.results.items() if q.increase > 0}
        if rose:
            out.append(GroupLookupCounts(g.group, rose))
    return tuple(out)


def group_lines(groups: tuple[GroupLookupCounts, ...]) -> list[str]:
    return [f"kv_group {g.group} lookups: " + ", ".join(f"{n(k)} {r}" for r, k in g.results.items())
            for g in groups]


@dataclass(frozen=True)
class StoppedGroup:
    """A KV group whose scan stopped ``rounds`` rounds' offers (its attention kind, "" unknown)."""

    group: str
    kind: str
    rounds: float


def stopped_groups(ev: Evidence, reason: S.ShortReason) -> tuple[StoppedGroup, ...]:
    """The groups that stopped rounds cut short for ``reason``, most rounds first; () with one
    KV group (nothing to tell apart) or when the input does not tell
    (``kvscope_restore_stopped_rounds_total``)."""
    if ev.kv_group_count < 2:
        return ()
    return tuple(StoppedGroup(g, kind, k) for g, kind, k in ev.stopping_groups(reason))


def stopped_line(groups: tuple[StoppedGroup, ...], what: str) -> list[str]:
    """["the offer stopped in KV group 0 (full_attention) in 1 round: <what>"], [] for none."""
    if not groups:
        return []
    named = ", ".join(f"KV group {g.group}" + (f" ({g.kind})" if g.kind else "")
                      + f" in {n(g.rounds)} round{'s' if g.rounds != 1 else ''}" for g in groups)
    return [f"the offer stopped in {named}: {what}"]


NO_FREE_ROW = "its next chunk's promotion found no free row"
GROUP_VETO = "its miss gave the cross-group AND 0 tokens"


@dataclass(frozen=True)
class CeilingGroups:
    """The KV groups that stopped offers the row ceiling cut: a promotion without a free row,
    or (several groups) a group whose miss, a promotion refused, vetoed the rest."""

    no_free_row: tuple[StoppedGroup, ...]
    group_veto: tuple[StoppedGroup, ...]

    @classmethod
    def read(cls, ev: Evidence) -> CeilingGroups:
        return cls(stopped_groups(ev, S.ShortReason.ROW_CEILING),
                   stopped_groups(ev, S.ShortReason.GROUP_VETO))

    def lines(self) -> list[str]:
        return stopped_line(self.no_free_row, NO_FREE_ROW) + stopped_line(self.group_veto, GROUP_VETO)


@dataclass(frozen=True)
class RowBytes:
    """Bytes of one primary-tier row and where that number came from (``--row-bytes``, the
    series, or the disk tier's bytes per key)."""

    bytes: int
    source: str


def read_row_bytes(ev: Evidence, th: Thresholds) -> RowBytes | None:
    rb = row_bytes(ev, th)
    return RowBytes(*rb) if rb is not None else None


def bytes_for(rows: int, rb: RowBytes | None) -> str:
    """' - cpu_bytes_to_use >= ...' for ``rows`` rows, or how to get bytes."""
    if rb is None:
        return (" (row bytes unknown: cpu_bytes_to_use = rows × row bytes; pass --row-bytes "
                "to get bytes)")
    b = rb.bytes
    return (f" — cpu_bytes_to_use ≥ {rows * b} ({nbytes(rows * b)} = {rows} rows × "
            f"{nbytes(b)} per row, {rb.source})")


@dataclass(frozen=True)
class RowSizing:
    """The rows the primary tier needs, with margin, from the largest vetoed/deferred request.

    A restore pins one row per chunk key of every KV group of the request until it is loaded,
    so a request restores only if the tier holds all its keys at once:
    ``kvscope_last_round_request_keys`` is that count, exactly. Never less than the current
    row count + 1: at the ceiling the tier was short by definition (a request that alone fits
    lost rows to concurrent restores or stores). Without that series (a relabel rule dropped
    it) only the lower bound is known, and the sentence says so.
    """

    rows_now: float
    request_keys: int | None  # the largest such request's chunk keys; None: series missing
    request_verdict: str  # "vetoed" | "deferred": the rounds that request was in
    kv_groups: int
    row_margin: float
    rows_wanted: int  # ceil(max(request_keys, rows_now + 1) × (1 + margin))
    row_bytes: RowBytes | None

    @classmethod
    def read(cls, ev: Evidence, th: Thresholds,
             verdicts: tuple[S.Verdict, ...] = (S.Verdict.VETOED,)) -> RowSizing:
        rows = ev.primary_rows
        rk = request_keys(ev, verdicts)
        keys = max(rk[0], int(rows) + 1) if rk is not None else int(rows) + 1
        return cls(rows_now=rows, request_keys=rk[0] if rk is not None else None,
                   request_verdict=(rk[1] if rk is not None else verdicts[0]).value,
                   kv_groups=ev.kv_group_count, row_margin=th.row_margin,
                   rows_wanted=math.ceil(keys * (1 + th.row_margin) - 1e-9),
                   row_bytes=read_row_bytes(ev, th))

    def sentence(self) -> str:
        """"grow the CPU primary tier to ≥ N rows (now R; why)" and the bytes."""
        rows, keys, groups = self.rows_now, self.request_keys, self.kv_groups
        if keys is not None and keys > rows:
            how = (f"the {self.request_verdict} request covers {keys} chunk keys over {groups} "
                   f"KV group{'s' if groups != 1 else ''}, all resident at once for a restore")
        elif keys is not None:
            how = (f"the {self.request_verdict} request alone covers {keys} keys ≤ {n(rows)} "
                   "rows: concurrent restores and stores held the rest")
        else:
            how = (f"more than the {n(rows)} rows the pending-key sum is pinned at; how many "
                   f"more is unknown: {S.LAST_ROUND_REQUEST_KEYS.name} is missing")
        how += f"; + {self.row_margin:.0%} margin"
        return (f"grow the CPU primary tier to ≥ {self.rows_wanted} rows (now {n(rows)}; {how})"
                + bytes_for(self.rows_wanted, self.row_bytes))


@dataclass(frozen=True)
class Coverage:
    """The window's restore coverage and its shortfall, for both ceiling forms."""

    lifetime: bool
    ratio: float | None  # tokens offered / tokens the tiers held; None: not readable
    offered_tokens: float
    held_tokens: float
    cut_tokens: float  # held but not offered for want of a free row

    @classmethod
    def read(cls, ev: Evidence) -> Coverage:
        c, r = ev.coverage, ev.rounds
        return cls(lifetime=ev.source.lifetime, ratio=c.ratio(r.hit_tokens),
                   offered_tokens=r.hit_tokens.increase, held_tokens=c.held_tokens.increase,
                   cut_tokens=c.tokens(S.ShortReason.ROW_CEILING).increase
                   + c.tokens(S.ShortReason.GROUP_VETO).increase)

    def lines(self) -> list[str]:
        lines = []
        if self.ratio is not None:
            lines.append(
                f"restore coverage {self.ratio:.1%} {window_phrase(self.lifetime)}: "
                f"{n(self.offered_tokens)} tokens offered of {n(self.held_tokens)} the tiers held")
        if self.cut_tokens > 0:
            lines.append(f"{n(self.cut_tokens)} tokens held but not offered for want of a free "
                         "row (recomputed)")
        return lines
