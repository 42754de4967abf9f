"""Healthy: no incident class holds; say what was checked and what was seen."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Unchecked
from ._common import n, secs
from .shared_facts import window_phrase

ID = "healthy"
TITLE = "Healthy"
SEVERITY = 0
INCONCLUSIVE_ID = "inconclusive"


@dataclass(frozen=True)
class RoundsSeen:
    """The lookup rounds the window shows, by verdict."""

    lifetime: bool
    rounds: float
    by_verdict: dict[str, float]
    hit_tokens: float

    @classmethod
    def read(cls, ev: Evidence) -> RoundsSeen:
        r = ev.rounds
        return cls(ev.source.lifetime, r.total, {v.value: r.get(v).increase for v in S.Verdict},
                   r.hit_tokens.increase)

    def line(self) -> str:
        return (f"{n(self.rounds)} lookup rounds {window_phrase(self.lifetime)}: "
                + ", ".join(f"{n(k)} {v}" for v, k in self.by_verdict.items())
                + f"; {n(self.hit_tokens)} tokens offered to load")


@dataclass(frozen=True)
class InconclusiveFacts(Facts):
    unchecked: tuple[Unchecked, ...]  # checks whose inputs were missing
    failed_checks: tuple[str, ...]  # check ids that raised
    seen: RoundsSeen

    def lines(self) -> list[str]:
        return ([u.line for u in self.unchecked]
                + [f"check {c} failed: see its finding" for c in self.failed_checks]
                + ["the checks that ran found no incident: " + self.seen.line()])


@dataclass(frozen=True)
class HealthyFacts(Facts):
    seen: RoundsSeen
    primary_rows: float
    occupied_rows: float
    promotions_completed: float
    cascades_completed: float
    reporting_ranks: int | None  # worker ranks reporting; None: no worker-side series
    world_size: int | None  # kvscope_info's world_size; None: unknown
    checksums_compared: float  # none mismatched
    shared_region_ranks: int  # ranks on the scheduler's own region file (nothing to compare)
    last_step_age_s: float | None
    idle: bool
    checked: tuple[str, ...]  # what every classifier verifies

    def lines(self) -> list[str]:
        w = window_phrase(self.seen.lifetime)
        lines = [
            self.seen.line(),
            f"primary tier {n(self.primary_rows)} rows ({n(self.occupied_rows)} occupied); "
            f"{n(self.promotions_completed)} promotions, {n(self.cascades_completed)} cascades {w}",
        ]
        if self.reporting_ranks is not None:
            k, ws = self.reporting_ranks, self.world_size
            ranks = (f"{k} of {ws} ranks reporting ({S.INFO.name} {S.L_WORLD_SIZE}={ws})"
                     if ws is not None else
                     f"{k} rank{'s' if k != 1 else ''} reporting (world size unknown: a rank "
                     "missing from every series would not show, see the notes)")
            line = f"{ranks}; {n(self.checksums_compared)} row checksums compared, 0 mismatched"
            if self.shared_region_ranks:
                k = self.shared_region_ranks
                line += (f" ({k} rank{'s' if k != 1 else ''} on the scheduler's own region file "
                         "read the promoted bytes themselves: nothing to compare)")
            lines.append(line)
        if self.last_step_age_s is not None:
            lines.append(f"last scheduler step {secs(self.last_step_age_s)} ago"
                         + (" (engine idle)" if self.idle else ""))
        return lines + [f"checked: {c}" for c in self.checked]


def inconclusive(ev: Evidence, unchecked: list[Unchecked], errors: list[Finding],
                 remedies: dict[str, str] | None = None) -> Finding:
    """No incident found by the checks that ran, but not every check ran: not healthy.
    ``remedies``: check id -> its own next step (the window-wide checks), where "make
    the missing series reach this source" is not the remedy."""
    k = len(unchecked) + len(errors)
    facts = InconclusiveFacts(tuple(unchecked), tuple(f.id.split(":", 1)[-1] for f in errors),
                              RoundsSeen.read(ev))
    step = ("Not healthy: not every check could run. Make the missing series reach this source "
            "(kvscope version on every process, relabel rules that keep kvscope_* series and "
            "their labels, every rank scraped) and run again; until then treat it as unknown.")
    remedies = remedies or {}
    steps = [remedies[u.check] for u in unchecked if u.check in remedies]
    if steps:
        if len(steps) < len(unchecked) or errors:
            steps.append("Then make the missing series reach this source and run again.")
        step = "Not healthy. " + " ".join(steps)
    return Finding(
        id=INCONCLUSIVE_ID,
        title=f"Inconclusive ({k} check{'s' if k != 1 else ''} could not run)",
        confidence=1.0,
        facts=facts,
        next_step=step,
        severity=SEVERITY,
        kind=INCONCLUSIVE_ID,
    )


def finding(ev: Evidence, checks: list[str]) -> Finding:
    workers = ev.worker_ranks
    shared = ev.tiers.checksum_ranks.get(S.RankCheck.SHARED_REGION.value)
    facts = HealthyFacts(
        seen=RoundsSeen.read(ev),
        primary_rows=ev.primary_rows,
        occupied_rows=ev.tiers.row(S.RowState.OCCUPIED).last,
        promotions_completed=ev.tiers.promotion(S.PromotionResult.COMPLETED).increase,
        cascades_completed=ev.tiers.cascade(S.CascadeResult.COMPLETED).increase,
        reporting_ranks=len(workers) if workers else None,
        world_size=ev.info_int(S.L_WORLD_SIZE),
        checksums_compared=sum(q.increase for rt in workers.values() for q in rt.checksums.values()),
        shared_region_ranks=int(shared.last) if shared is not None and shared.present else 0,
        last_step_age_s=ev.freshness.newest_age,
        idle=ev.idle,
        checked=tuple(checks),
    )
    return Finding(
        id=ID,
        title=TITLE,
        confidence=1.0,
        facts=facts,
        next_step="Nothing to do.",
        severity=SEVERITY,
        kind=ID,
    )
