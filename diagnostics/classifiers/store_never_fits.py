"""Store never fits: one step's store job is larger than the primary tier.

``prepare_store`` refuses the whole job (``no_space``), so nothing from it
reaches any tier, and the disk tier stays empty.
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..evidence import Evidence
from ..model import Finding, Mark
from ..thresholds import Thresholds
from ._common import n, window_word

ID = "store_never_fits"
TITLE = "Store never fits the primary tier"
SEVERITY = 75
CHECK = "store jobs refused for lack of space with nothing reaching the disk tier"


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    no_space = ev.tiers.store(S.StoreJobResult.NO_SPACE)
    cascaded = ev.tiers.cascade(S.CascadeResult.COMPLETED)
    if no_space.increase <= 0 or cascaded.last > 0:
        return None
    prepared = ev.tiers.store(S.StoreJobResult.PREPARED).increase
    w = window_word(ev)
    lines = [
        f"{n(no_space.increase)} store jobs refused for lack of space (no_space) {w}, "
        f"{n(prepared)} prepared",
        "0 keys reached the disk tier (no completed cascade)",
        f"primary tier: {n(ev.primary_rows)} rows",
    ]
    if no_space.recent > 0:
        lines.append(f"still happening: +{n(no_space.recent)} refused in the last {ev.source.recent_span:.0f} s")
    conf = 0.9 if prepared == 0 else 0.6
    marks = [Mark("stores", no_space.samples[-1][0], "no_space")] if no_space.samples else []
    return Finding(
        id=ID,
        title=TITLE,
        confidence=conf,
        evidence=lines,
        next_step=(
            "One step's store job (a whole prompt prefilled in one step) is larger than the CPU "
            f"primary tier ({n(ev.primary_rows)} rows): raise cpu_bytes_to_use, or lower "
            "max_num_batched_tokens so a step stores fewer rows."
        ),
        severity=SEVERITY,
        marks=marks,
    )
