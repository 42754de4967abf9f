"""The facts of an unclassified anomaly: one record per invariant that broke unexplained
(:mod:`.unclassified_anomaly` reads them), each rendering its own evidence line."""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..model import Facts
from ._common import n, secs
from .shared_facts import window_phrase


@dataclass(frozen=True)
class RoundsFailing:
    """Most lookup rounds vetoed (restores thrown away), or vetoed/deferred with no hit."""

    lifetime: bool
    rounds: float
    vetoed: float
    deferred: float
    hit: float
    mostly_vetoed: bool  # False: vetoed or deferred, 0 hit

    def line(self) -> str:
        w = window_phrase(self.lifetime)
        if self.mostly_vetoed:
            return (f"{n(self.vetoed)} of {n(self.rounds)} lookup rounds {w} vetoed "
                    f"({self.vetoed / self.rounds:.0%}), {n(self.hit)} hit: restores that found "
                    "keys were thrown away")
        return (f"{n(self.vetoed + self.deferred)} of {n(self.rounds)} lookup rounds {w} vetoed "
                "or deferred, 0 hit: the tiers found keys and never restored one")


@dataclass(frozen=True)
class Collapse:
    """A ratio high before the recent span, low in it: token coverage (offered / held
    tokens) or the hit ratio of the rounds that found keys."""

    of: str  # "tokens" (restore coverage) | "rounds" (restore hit ratio)
    before: float
    before_count: float  # tokens held / rounds that found keys, before the recent span
    recent: float
    recent_count: float
    recent_span_s: float

    def line(self) -> str:
        span = secs(self.recent_span_s)
        if self.of == "tokens":
            return (f"restore coverage collapsed: {self.before:.0%} of {n(self.before_count)} "
                    f"tokens the tiers held were offered before, {self.recent:.0%} of "
                    f"{n(self.recent_count)} in the last {span}")
        return (f"restore hit ratio collapsed: {self.before:.0%} of {n(self.before_count)} rounds "
                f"that found keys hit before, {self.recent:.0%} of {n(self.recent_count)} in the "
                f"last {span}")


@dataclass(frozen=True)
class LowCoverage:
    """Over the window, far fewer tokens offered than the tiers held."""

    lifetime: bool
    offered_tokens: float
    held_tokens: float
    not_offered_by_reason: dict[str, float]  # held tokens not offered, by reason (those > 0)

    def line(self) -> str:
        why = ", ".join(f"{k} {n(v)}" for k, v in self.not_offered_by_reason.items())
        return (f"restore coverage {self.offered_tokens / self.held_tokens:.0%}: "
                f"{n(self.offered_tokens)} of {n(self.held_tokens)} tokens the tiers held were "
                f"offered to load {window_phrase(self.lifetime)}"
                + (f" (held tokens not offered, by reason: {why})" if why else ""))


@dataclass(frozen=True)
class StuckTransfer:
    kind: str  # load | store | promotion | cascade
    pending_s: float  # the oldest one's age (max over the window)
    factor: float  # the threshold: factor × --stuck-after
    stuck_after_s: float

    def line(self) -> str:
        return (f"a {self.kind} transfer pending {secs(self.pending_s)} (≥ {self.factor:g}× "
                f"--stuck-after {secs(self.stuck_after_s)}): longer than any real transfer")


@dataclass(frozen=True)
class IdlePending:
    """Transfers pending on an idle engine, judged without the age series (at least this)."""

    kind: str
    transfers: float
    pending_s: float

    def line(self) -> str:
        return (f"{n(self.transfers)} {self.kind} transfer(s) pending for {secs(self.pending_s)} "
                f"on an idle engine ({S.OLDEST_PENDING_TRANSFER.name} missing: the age is at "
                "least that)")


@dataclass(frozen=True)
class StrayFault:
    """A vLLM fault kvscope contained where no engine runs a release with that bug."""

    lifetime: bool
    fault: str
    contained: float
    fixed_in: str | None  # the release that fixed it, where known_bugs names one
    vllm_versions: tuple[str, ...]

    def line(self) -> str:
        fixed = f" (fixed in vLLM {self.fixed_in})" if self.fixed_in else ""
        return (f"kvscope counted {n(self.contained)} contained vLLM fault(s) {self.fault} "
                f"{window_phrase(self.lifetime)}, yet no engine here runs a release with that "
                f"bug{fixed}: vLLM {', '.join(self.vllm_versions)}, where kvscope wraps nothing "
                "for it (a window mixing engines, or one mislabelled)")


@dataclass(frozen=True)
class AnomalyFacts(Facts):
    """The invariants that broke unexplained; each None / () where it held or was explained."""

    rounds_failing: RoundsFailing | None
    coverage_collapsed: Collapse | None  # tokens, else (no token series) the hit ratio
    low_coverage: LowCoverage | None
    stuck_transfers: tuple[StuckTransfer, ...]
    idle_pending: tuple[IdlePending, ...]
    stray_faults: tuple[StrayFault, ...]
    failed_targets: int  # targets that gave nothing usable

    @property
    def broken(self) -> list[str]:
        """The invariant kinds that broke (``EXPLAINS`` of the classifiers names them)."""
        return [k for k, on in (
            ("rounds", self.rounds_failing is not None),
            ("coverage", self.coverage_collapsed is not None or self.low_coverage is not None),
            ("stuck_transfer", bool(self.stuck_transfers or self.idle_pending)),
            ("contained_fault", bool(self.stray_faults))) if on]

    def lines(self) -> list[str]:
        parts = [self.rounds_failing, self.coverage_collapsed, self.low_coverage,
                 *self.stuck_transfers, *self.idle_pending, *self.stray_faults]
        lines = [p.line() for p in parts if p is not None]
        if self.failed_targets:
            lines.append(f"{self.failed_targets} target(s) gave nothing usable: their series are "
                         "not in this evidence")
        return lines
