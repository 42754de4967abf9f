"""Tier data lost: keys the disk tier confirmed written whose files are gone.

vLLM's fs tier never deletes what it wrote (no eviction) and recreates its folders on
each write, so a directory removed, a volume unmounted or wiped mid-run fails nothing:
later writes succeed, earlier keys silently miss and are recomputed. kvscope's tier
probe (``connector/tiers/probe.py``) checks that the latest keys written still have
their files and counts each one gone (``kvscope_tier_lost_keys_total{tier}``).

The series is optional: a kvscope with the probe off exports none of the probe's
series, and then nothing here can hold (the other checks still judge the window);
with the probe's other series there, a missing one is "could not check".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark, Quantity
from ..thresholds import Thresholds
from ._common import n, secs
from .shared_facts import window_phrase

ID = "tier_data_lost"
TITLE = "The disk tier lost data it had confirmed written"
SEVERITY = 66
CHECK = ("keys the disk tier confirmed written found gone (directory removed, volume unmounted "
         "or wiped; from kvscope's tier probe where the engine exports it)")
# What is gone from disk cannot be restored (coverage), and every lookup of it on vLLM
# 0.26's fs tier is deferred by the tier's asynchronous existence check, then misses
# (rounds deferred without a hit).
EXPLAINS = frozenset({"coverage", "rounds"})


def needs(ev: Evidence) -> tuple:
    """The probe exports its three series together from its first step: with one of the
    others there, a missing lost-keys series was dropped (could not check), not a probe
    that is off."""
    probe_on = ev.has(S.TIER_ROOT_PRESENT) or ev.has(S.TIER_LAST_LOSS_TIMESTAMP)
    return (S.TIER_LOST_KEYS,) if probe_on else ()


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _first_rise(q: Quantity) -> float | None:
    """When the (summed) counter first rose within the window's samples."""
    for (_, before), (t, v) in zip(q.samples, q.samples[1:]):
        if v > before:
            return t
    return None


def secs_between(q: Quantity) -> float:
    """The series' sampling step (0 with fewer than two samples)."""
    return (q.samples[-1][0] - q.samples[0][0]) / (len(q.samples) - 1) if len(q.samples) > 1 else 0


@dataclass(frozen=True)
class LostTier:
    tier: str
    lost_keys: float  # keys it had confirmed written, found gone
    last_loss_at: float | None  # unix s the probe last found keys lost; None: not exported
    first_loss_at: float | None  # unix s the counter first rose in the window's samples
    sample_step_s: float  # the counter's sampling step (0: one sample)
    root_present: bool | None  # its start-up directory exists; None: not exported

    @property
    def earlier_losses(self) -> bool:
        """The first rise is well before the last loss (or the last is unknown)."""
        return self.first_loss_at is not None and (
            self.last_loss_at is None
            or self.last_loss_at - self.first_loss_at > 2 * self.sample_step_s)


@dataclass(frozen=True)
class DataLostFacts(Facts):
    lifetime: bool
    window_end: float
    tiers: tuple[LostTier, ...]
    cascades_completed: float
    promotions_completed: float

    @property
    def directory_gone(self) -> bool:
        return any(t.root_present is False for t in self.tiers)

    def lines(self) -> list[str]:
        w = window_phrase(self.lifetime)
        lines = []
        for t in self.tiers:
            lines.append(f"{n(t.lost_keys)} key(s) the {t.tier} tier had confirmed written were "
                         f"found gone {w} (their block files removed, or replaced by a later write)")
            if t.last_loss_at is not None:
                ago = self.window_end - t.last_loss_at
                lines.append(f"the probe last found keys lost at {_utc(t.last_loss_at)}"
                             + (f" ({secs(ago)} before the window's end)" if ago >= 0 else ""))
            if t.earlier_losses:
                lines.append(f"the first loss in the window was exported at {_utc(t.first_loss_at)}")
            if t.root_present is False:
                lines.append(f"the directory the {t.tier} tier created at start-up is gone "
                             f"({S.TIER_ROOT_PRESENT.name} 0): removed, or its mount is gone")
            elif t.root_present:
                lines.append(f"the {t.tier} tier's start-up directory still exists: block files "
                             "were deleted out of band, or vLLM removed files it could not read")
        lines.append(f"{n(self.cascades_completed)} cascades completed and "
                     f"{n(self.promotions_completed)} promotions completed {w}: nothing failed, "
                     "the lost prefixes are recomputed")
        return lines


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    lost = {tier: q for tier, q in ev.tiers.lost_keys.items() if q.increase > 0}
    if not lost:
        return None
    tiers: list[LostTier] = []
    marks: list[Mark] = []
    for tier, q in lost.items():
        first = _first_rise(q)
        last = ev.tiers.last_loss.get(tier)
        found = last.last if last is not None and last.present and last.last > 0 else None
        if first is not None:
            marks.append(Mark("stores", found if found is not None and found <= first else first,
                              f"{tier} keys lost"))
        root = ev.tiers.root_present.get(tier)
        tiers.append(LostTier(tier, q.increase, found, first, secs_between(q),
                              root.last != 0 if root is not None and root.present else None))
    facts = DataLostFacts(
        lifetime=ev.source.lifetime,
        window_end=ev.source.end,
        tiers=tuple(tiers),
        cascades_completed=ev.tiers.cascade(S.CascadeResult.COMPLETED).increase,
        promotions_completed=ev.tiers.promotion(S.PromotionResult.COMPLETED).increase,
    )
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.9,
        facts=facts,
        next_step=(
            "Check the disk tier's volume on the engine host: ls -ld <root_dir>, mount | grep "
            "<root_dir>, the host journal around the loss time (an unmount, a volume detach, a "
            "pod given a fresh emptyDir). Then find who removed the files: cleanup jobs or tmp "
            "cleaners over <root_dir>, other processes sharing it. Serving is correct (lost "
            "prefixes are recomputed and stored again)"
            + ("; restart the engine at a quiet moment so vLLM rewrites the tier's start-up "
               "directory." if facts.directory_gone else ".")),
        severity=SEVERITY,
        marks=marks,
    )
