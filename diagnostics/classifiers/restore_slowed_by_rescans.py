"""Restore slowed by rescans: most of the restores' time went to the scheduler's deferred
rescans, not to reading the tiers or loading the GPU.

A request whose prefix a secondary tier holds is deferred until its promotions land, and
vLLM asks it again every step: each round looks up the prompt's keys anew. The rounds cost
O(keys) each and their number grows with the promotion time, itself O(keys), so a very long
prefix restores in time quadratic in its length (a 1M-token restore: ~1,500 rescans of
62,500 keys), and the rescans hold the scheduler thread (and the GIL the tier's read
threads need). kvscope splits each restore's time (``kvscope_restore_phase_seconds_total``,
connector/lookup/restore_clock.py); this class names the windows where the rescans dominate.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding
from ..thresholds import Thresholds
from ._common import n, secs
from .shared_facts import window_phrase

ID = "restore_slowed_by_rescans"
TITLE = "Restores slowed by the scheduler's deferred rescans"
SEVERITY = 25  # serving is slow, not wrong: every incident that breaks it ranks first
CHECK = ("restores whose time went mostly to the scheduler's deferred rescans (where the "
         "engine exports kvscope's restore time split)")
NEEDS = ()  # an engine without the split (an older kvscope, native mode) is not judged
EXPLAINS = frozenset()


@dataclass(frozen=True)
class RescanFacts(Facts):
    lifetime: bool
    restores: float  # restores that ended in the window
    restore_s: float  # their seconds, summed
    phase_s: dict[str, float]  # RestorePhase value -> seconds
    rescans: float  # their deferred rounds
    rescan_keys: float  # keys those rounds looked up

    @property
    def rescan_s(self) -> float:
        return self.phase_s.get(S.RestorePhase.DEFERRED_RESCANS.value, 0.0)

    @property
    def share(self) -> float:
        return self.rescan_s / self.restore_s if self.restore_s else 0.0

    @property
    def keys_per_rescan(self) -> float:
        return self.rescan_keys / self.rescans if self.rescans else 0.0

    def lines(self) -> list[str]:
        r = self.restores
        split = ", ".join(f"{p} {secs(s)}" for p, s in self.phase_s.items())
        return [
            f"{n(r)} restore{'s' if r != 1 else ''} {window_phrase(self.lifetime)} took "
            f"{secs(self.restore_s)}: {split}",
            f"{self.share:.0%} in {n(self.rescans)} deferred rescans of "
            f"{n(self.keys_per_rescan)} keys each ({S.RESTORE_RESCANS.name}, "
            f"{S.RESTORE_RESCAN_KEYS.name}): {secs(self.rescan_s / self.rescans if self.rescans else 0)} "
            "per rescan on the scheduler thread",
        ]


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    t = ev.restore_time
    if not (t.seconds.present and t.rescans.present) or t.restores.increase <= 0:
        return None
    if ev.idle:  # nothing runs or waits: an idle engine reads idle, whatever its past restores
        return None
    phases = {p.value: t.phase(p).increase for p in S.RestorePhase if t.phase(p).present}
    facts = RescanFacts(
        lifetime=ev.source.lifetime,
        restores=t.restores.increase,
        restore_s=t.seconds.increase,
        phase_s=phases,
        rescans=t.rescans.increase,
        rescan_keys=t.rescan_keys.increase,
    )
    if facts.restore_s < th.slow_restore_s or facts.share < th.rescan_share:
        return None
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.6,  # medium: an incident of the same band or above ranks first
        facts=facts,
        next_step=(
            f"Each rescan looks up ~{n(facts.keys_per_rescan)} keys, and their number grows "
            "with the promotion's time: fewer keys per rescan shorten both (a larger "
            "offloaded block_size: keys = prefix tokens / block_size), and so do faster "
            "reads from the tier (n_read_threads, a faster volume) or a restore kept in the "
            "CPU tier (more rows: no promotion, no deferred rounds). Splitting very long "
            "prompts shortens each restore quadratically."),
        severity=SEVERITY,
    )
