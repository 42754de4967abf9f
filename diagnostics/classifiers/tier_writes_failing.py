"""Tier writes failing: cascades to the disk tier fail (full, gone, not writable).

vLLM's fs tier reports a cascade failed when a block write raises (``ENOSPC``, a
removed directory or mount, I/O errors). Serving goes on with the right tokens,
but what does not reach the tier cannot come back from it: restores decay
while every other counter looks healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n
from .needs import tiered
from .shared_facts import window_phrase

ID = "tier_writes_failing"
TITLE = "Writes to the disk tier are failing"
SEVERITY = 60
CHECK = "cascade writes to the disk tier failing (tier full, gone or not writable)"
EXPLAINS = frozenset({"coverage"})  # what never reached disk cannot be restored


def needs(ev: Evidence) -> tuple:
    """Cascades exist only with a secondary tier."""
    return (S.CASCADES,) if tiered(ev) else ()


@dataclass(frozen=True)
class WritesFailingFacts(Facts):
    lifetime: bool
    cascades_failed: float
    cascades_completed: float
    recent_failed: float  # failed in the recent span: still happening
    recent_span_s: float
    promotions_completed: float

    def lines(self) -> list[str]:
        w = window_phrase(self.lifetime)
        lines = [f"{n(self.cascades_failed)} cascade writes to the disk tier failed {w}, "
                 f"{n(self.cascades_completed)} completed"]
        if self.recent_failed > 0:
            lines.append(f"still happening: +{n(self.recent_failed)} failed in the last "
                         f"{self.recent_span_s:.0f} s")
        lines.append(f"{n(self.promotions_completed)} promotions completed {w} (restores from "
                     "the disk tier)")
        return lines


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    failed = ev.tiers.cascade(S.CascadeResult.FAILED)
    if not tiered(ev) or failed.increase <= 0:
        return None
    done = ev.tiers.cascade(S.CascadeResult.COMPLETED).increase
    facts = WritesFailingFacts(
        lifetime=ev.source.lifetime,
        cascades_failed=failed.increase,
        cascades_completed=done,
        recent_failed=failed.recent,
        recent_span_s=ev.source.recent_span,
        promotions_completed=ev.tiers.promotion(S.PromotionResult.COMPLETED).increase,
    )
    marks = [Mark("stores", failed.samples[-1][0], "cascades failed")] if failed.samples else []
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.85 if done == 0 else 0.6,
        facts=facts,
        next_step=(
            "Check the disk tier's filesystem on the engine host: free space (df -h <root_dir>), "
            "the directory and its mount, write permission; vLLM logs each failed block write "
            "('block I/O failed: [Errno ...]'). Writes resume once the tier is writable (vLLM "
            "recreates missing directories); only prefixes stored after that can be restored."),
        severity=SEVERITY,
        marks=marks,
    )
