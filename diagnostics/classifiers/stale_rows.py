"""Stale-row corruption: a restored row differs between rank slots.

A promotion writes the whole row (every rank slot) from the scheduler host's
view; a rank whose slot lives elsewhere (another host) loads bytes it never
wrote. The worker compares each promoted row's checksum before a CPU->GPU load.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n, nbytes
from .shared_facts import window_phrase

ID = "stale_row_corruption"
TITLE = "Stale-row corruption (per-rank checksum mismatch)"
SEVERITY = 100
CHECK = "promoted-row checksums per rank (stale-row corruption)"
# Worker-side series: scrape every rank (or vLLM's /metrics, which merges them).
NEEDS = (S.ROW_CHECKSUMS, S.LOADS_REFUSED)
EXPLAINS = frozenset({"rounds"})


@dataclass(frozen=True)
class MismatchedRank:
    rank: str
    mismatched: float  # promoted-row checksums that mismatched
    matched: float
    loads_refused: float  # load jobs refused for a mismatch (vLLM recomputed those tokens)
    loads_unreadable: float  # loads refused as unreadable (checksum_error)
    loaded_bytes: float | None  # CPU -> GPU bytes on this rank; None: not exported

    @property
    def served(self) -> bool:
        """A policy is all-or-nothing per rank: one that refused none of its mismatching
        loads served every one of them (checksums count rows, refusals load jobs)."""
        return self.mismatched > 0 and self.loads_refused == 0


@dataclass(frozen=True)
class MatchedRank:
    rank: str
    rows: float  # promoted-row checksums that matched


@dataclass(frozen=True)
class StaleRowsFacts(Facts):
    lifetime: bool
    mismatched_ranks: tuple[MismatchedRank, ...]
    clean_ranks: tuple[MatchedRank, ...]  # ranks with matching checksums only
    checksum_policies: tuple[str, ...]  # kvscope_info's checksum_policy values
    quarantined_keys: float | None  # latest; None: none quarantined in the window
    quarantined_keys_max: float | None
    promotions_completed: float

    @property
    def served_ranks(self) -> tuple[str, ...]:
        return tuple(r.rank for r in self.mismatched_ranks if r.served)

    def lines(self) -> list[str]:
        w = window_phrase(self.lifetime)
        lines = []
        for r in self.mismatched_ranks:
            mism, err, ref = r.mismatched, r.loads_unreadable, r.loads_refused
            line = (f"rank {r.rank}: {n(mism)} of {n(mism + r.matched)} promoted-row checksums "
                    f"mismatched {w}")
            if err:
                line += f"; {n(err)} load{'s' if err != 1 else ''} refused as unreadable (checksum_error)"
            if r.served:
                line += ", 0 loads refused: the mismatching rows were SERVED"
                if r.loaded_bytes is not None and r.loaded_bytes > 0:
                    line += f" ({nbytes(r.loaded_bytes)} loaded CPU -> GPU on this rank)"
            elif ref > 0:
                line += (f", {n(ref)} load job{'s' if ref != 1 else ''} refused (vLLM recomputed "
                         "those tokens)")
            lines.append(line)
        if self.clean_ranks:
            lines.append("matching checksums only: "
                         + ", ".join(f"rank {r.rank} ({n(r.rows)} rows)" for r in self.clean_ranks))
        policies, served = self.checksum_policies, self.served_ranks
        if policies:
            pol = f"{S.L_CHECKSUM_POLICY}={'/'.join(policies)} ({S.INFO.name})"
            if served and policies == ("refuse",):
                lines.append(
                    f"{pol}, yet rank {', '.join(served)} refused none: observe was in effect "
                    "(kvscope degrades refuse to observe where vLLM cannot recompute refused "
                    "loads, e.g. several KV groups on vLLM 0.26)"
                )
            elif served:
                lines.append(f"{pol}: mismatching loads are counted and served")
            else:
                lines.append(f"{pol}: mismatching loads are refused and recomputed")
        if self.quarantined_keys is not None:
            lines.append(
                f"{n(self.quarantined_keys)} keys quarantined now (max "
                f"{n(self.quarantined_keys_max)}): answered MISS so vLLM recomputes them instead "
                "of reloading the same stale rows"
            )
        if self.promotions_completed > 0:
            lines.append(f"{n(self.promotions_completed)} promotions completed {w} (rows "
                         "restored from the disk tier)")
        return lines


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    ranks = ev.worker_ranks
    bad = {
        rank: rt for rank, rt in ranks.items()
        if rt.checksum(S.ChecksumOutcome.MISMATCH).increase > 0
        or rt.refusals(S.RefusalReason.CHECKSUM_ERROR).increase > 0
    }
    if not bad:
        return None
    mismatched = []
    for rank, rt in bad.items():
        loaded = rt.bytes.get(S.Direction.CPU_TO_GPU.value)
        mismatched.append(MismatchedRank(
            rank=rank,
            mismatched=rt.checksum(S.ChecksumOutcome.MISMATCH).increase,
            matched=rt.checksum(S.ChecksumOutcome.MATCH).increase,
            loads_refused=rt.refusals(S.RefusalReason.CHECKSUM_MISMATCH).increase,
            loads_unreadable=rt.refusals(S.RefusalReason.CHECKSUM_ERROR).increase,
            loaded_bytes=loaded.increase if loaded is not None else None,
        ))
    quarantined = ev.tiers.quarantined_keys
    shown = quarantined.present and quarantined.max > 0
    facts = StaleRowsFacts(
        lifetime=ev.source.lifetime,
        mismatched_ranks=tuple(mismatched),
        clean_ranks=tuple(
            MatchedRank(r, rt.checksum(S.ChecksumOutcome.MATCH).increase)
            for r, rt in ranks.items()
            if r not in bad and rt.checksum(S.ChecksumOutcome.MATCH).increase > 0),
        checksum_policies=ev.checksum_policies,
        quarantined_keys=quarantined.last if shown else None,
        quarantined_keys_max=quarantined.max if shown else None,
        promotions_completed=ev.tiers.promotion(S.PromotionResult.COMPLETED).increase,
    )
    conf = 0.85 + (0.1 if facts.promotions_completed > 0 else 0)
    if facts.served_ranks:
        verdict = (
            "Mismatching rows were SERVED: outputs of requests restored since the first mismatch "
            "may be wrong, treat them as suspect. "
        )
        fix = " Use checksum_policy=refuse where vLLM can recompute (single KV group on vLLM 0.26)."
    else:
        verdict = (
            "Every mismatching load was refused and recomputed: answers are correct, the restores "
            "are wasted. "
        )
        fix = ""
    marks = []
    for rank, rt in bad.items():
        q = rt.checksum(S.ChecksumOutcome.MISMATCH)
        rises = [t for (t0, v0), (t, v) in zip(q.samples, q.samples[1:], strict=False) if v > v0]
        if rises or q.samples:
            marks.append(Mark("checksums", (rises or [q.samples[-1][0]])[0], f"rank {rank} mismatch"))
    return Finding(
        id=ID,
        title=TITLE,
        confidence=min(conf, 0.99),
        facts=facts,
        next_step=verdict
        + "Rank slots of restored rows are not what those ranks wrote: the tier's rows are one "
        "host's view (nnodes > 1 with TieringOffloadingSpec?). Keep tiering single-node and clear "
        "the fs tier's directory." + fix,
        severity=SEVERITY,
        marks=marks,
    )
