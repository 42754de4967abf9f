"""Known vLLM bug: a bug of ``diagnostics/known_bugs.py`` whose evidence the window shows, on
an engine whose vLLM release has it.

The running release is ``kvscope_info{vllm_version}``, per engine. A bug is named only for
engines on a release that has it (never on the release that fixed it or later); the finding
says what to upgrade to and what to do until then. The same evidence where no engine runs an
affected release is not this class: ``unclassified_anomaly`` reports it (kvscope wraps nothing
on a fixed release, so such a count is inconsistent). Bugs that other classes already name
(the capacity ceiling, a transfer that never completes) and bugs no series can show are
listed in ``known_bugs`` but not named here.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..known_bugs import KNOWN_BUGS, KnownBug
from ..model import Facts, Finding
from ..thresholds import Thresholds
from .shared_facts import window_phrase

ID = "known_vllm_bug"
TITLE = "A known vLLM bug"
SEVERITY = 62  # the engine lived (contained): what serving suffers now ranks first
CHECK = ("known vLLM offload bugs of the running vLLM release (diagnostics/known_bugs.py), from "
         f"{S.VLLM_FAULTS_CONTAINED.name} where the engine exports it")
# what it explains of unclassified_anomaly's invariants: the contained fault itself
EXPLAINS = frozenset({"contained_fault"})


def contained_faults(ev: Evidence) -> dict[str, float]:
    """Fault -> times kvscope contained it in the window (those that rose)."""
    return {f: q.increase for f, q in sorted(ev.vllm_faults.items())
            if q.present and q.increase > 0}


def needs(ev: Evidence) -> tuple:
    """A rise names a bug only with the release it ran on (kvscope_info)."""
    return (S.INFO,) if contained_faults(ev) else ()


def affected_engines(ev: Evidence, bug: KnownBug) -> list[AffectedEngine]:
    """The engines whose release has ``bug``."""
    return [AffectedEngine(t.vllm_version, t.key) for t in ev.targets if bug.affects(t.vllm_version)]


@dataclass(frozen=True)
class AffectedEngine:
    vllm_version: str
    engine: str  # target, then vLLM's model_name= and engine= where labelled


@dataclass(frozen=True)
class NamedBug:
    """A bug of ``diagnostics/known_bugs.py`` the window shows, on engines that have it."""

    id: str
    title: str
    upstream: str  # vLLM's tracker: the issue and the fix
    since: str
    fixed_in: str | None  # None: no release fixes it yet
    verified: str  # where in vLLM's source it was checked
    shown: tuple[str, ...]  # the bug's evidence rule's own lines (known_bugs.py)
    engines: tuple[AffectedEngine, ...]

    def lines(self, lifetime: bool) -> list[str]:
        engines = ", ".join(f"{e.vllm_version} on {e.engine}" for e in self.engines)
        return [f"{self.title} ({window_phrase(lifetime)}): {self.upstream}", *self.shown,
                f"vLLM {engines}: the releases from {self.since} "
                + (f"before {self.fixed_in} have it" if self.fixed_in else "on have it "
                   "(no release fixes it yet)"),
                f"checked in vLLM's source: {self.verified}"]


@dataclass(frozen=True)
class KnownBugFacts(Facts):
    lifetime: bool
    bugs: tuple[NamedBug, ...]
    faults_contained: dict[str, float]  # fault -> calls kvscope contained (those that rose)

    def lines(self) -> list[str]:
        return [line for b in self.bugs for line in b.lines(self.lifetime)]


def shown_bugs(ev: Evidence) -> list[tuple[KnownBug, list[str], list[AffectedEngine]]]:
    """(bug, its evidence lines, the affected engines) of every bug the window shows on an
    engine whose release has it."""
    out = []
    for bug in KNOWN_BUGS:
        if bug.evidence is None:
            continue
        shown = bug.evidence(ev)
        engines = affected_engines(ev, bug) if shown else []
        if engines:
            out.append((bug, shown, engines))
    return out


def explains(ev: Evidence) -> frozenset[str]:
    """The unclassified invariants this class explains: a contained fault, and what a named
    bug's shape breaks (the drafter group's veto: every restore's coverage)."""
    out = set(EXPLAINS)
    for bug, _, _ in shown_bugs(ev):
        out |= bug.explains
    return frozenset(out)


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    named: list[KnownBug] = []
    bugs: list[NamedBug] = []
    for bug, shown, engines in shown_bugs(ev):
        named.append(bug)
        bugs.append(NamedBug(bug.id, bug.title, bug.upstream, bug.since, bug.fixed_in,
                             bug.verified, tuple(shown), tuple(engines)))
    if not named:
        return None
    upgrade = [f"{b.id}: upgrade vLLM to {b.fixed_in} or later" for b in named if b.fixed_in]
    until = [f"until then ({b.id}): {b.until_then}" for b in named]
    return Finding(
        id=ID,
        title=f"{TITLE} ({', '.join(b.id for b in named)})",
        confidence=0.95,
        facts=KnownBugFacts(ev.source.lifetime, tuple(bugs), contained_faults(ev)),
        next_step="; ".join(upgrade + until) + ".",
        severity=SEVERITY,
    )
