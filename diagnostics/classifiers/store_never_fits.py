"""Store never fits: one step's store job is larger than the primary tier.

``prepare_store`` refuses the whole job (``no_space``), so nothing from it
reaches any tier, and the disk tier stays empty.
"""

from __future__ import annotations

import math

from kvscope.exporters import signals as S

from ..checks import tiered
from ..evidence import Evidence
from ..model import Finding, Mark
from ..thresholds import Thresholds
from ._common import bytes_for, n, window_word

# Refused store jobs per prepared one above which stores "never fit" even though
# some fit (see classify).
MOSTLY_REFUSED = 5

ID = "store_never_fits"
TITLE = "Store never fits the primary tier"
SEVERITY = 75
CHECK = "store jobs refused for lack of space with nothing reaching the disk tier"
EXPLAINS = frozenset({"rounds", "coverage"})


def needs(ev: Evidence) -> tuple:
    """Cascades exist only with a secondary tier."""
    return (S.STORE_JOBS, S.PRIMARY_ROWS) + ((S.CASCADES,) if tiered(ev) else ())


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    no_space = ev.tiers.store(S.StoreJobResult.NO_SPACE)
    cascaded = ev.tiers.cascade(S.CascadeResult.COMPLETED)
    prepared = ev.tiers.store(S.StoreJobResult.PREPARED).increase
    # Something reached the last tier: a completed cascade to disk, or, with the
    # CPU tier alone (nothing cascades), a store job that fit. A job refused now
    # and then (rows pinned by other requests' stores) is not "never fits".
    reached = cascaded.last > 0 if tiered(ev) else prepared > 0
    # ... unless refusals outnumber fitting jobs many times over: a refused job is
    # retried (grown) every step, so the few that fit are other requests' (the
    # oracle matrix: 104 refused, 3 prepared, the re-asked prompts never stored).
    mostly_refused = prepared > 0 and no_space.increase > MOSTLY_REFUSED * prepared
    if no_space.increase <= 0 or (reached and not mostly_refused):
        return None
    rows = int(ev.primary_rows)
    w = window_word(ev)
    lines = [
        f"{n(no_space.increase)} store jobs refused for lack of space (no_space) {w}, "
        f"{n(prepared)} prepared",
    ]
    if not reached:
        lines.append("0 keys reached the disk tier (no completed cascade)" if tiered(ev) else
                     "0 store jobs fit the CPU tier (the only tier)")
    else:
        lines.append(f"refused jobs outnumber prepared ones {n(round(no_space.increase / prepared))}:1: "
                     "the prompts whose job is refused are never stored"
                     + (f" ({n(cascaded.last)} keys reached the disk tier from the jobs "
                        "that fit)" if tiered(ev) else ""))
    if no_space.recent > 0:
        lines.append(f"still happening: +{n(no_space.recent)} refused in the last {ev.source.recent_span:.0f} s")
    conf = 0.9 if prepared == 0 else 0.6 if not reached else 0.5
    # One request's store job in one step covers the full chunks its prefill
    # completed in that step, in every KV group: up to
    # ceil(max_num_batched_tokens / chunk_tokens) chunks x groups rows, which
    # prepare_store must find free at once or refuses whole.
    groups = ev.kv_group_count
    chunk = ev.info_int("chunk_tokens")
    batched = ev.info_int("max_num_batched_tokens")
    if chunk and batched:
        per_step = math.ceil(batched / chunk) * groups
        lines.append(
            f"one step can prefill max_num_batched_tokens={batched} tokens = "
            f"{math.ceil(batched / chunk)} chunks of {chunk} tokens × {groups} KV group"
            f"{'s' if groups != 1 else ''} = {per_step} rows per store job; primary tier: {rows} rows"
        )
        fit_tokens = (rows // groups) * chunk
        need = math.ceil(per_step * (1 + th.row_margin) - 1e-9)
        lower = (f"lower max_num_batched_tokens to ≤ {fit_tokens} (= {rows // groups} chunks × "
                 f"{chunk} tokens per group: a step's store job then fits {rows} rows, with no "
                 "room left for restores)" if fit_tokens > 0 else
                 f"the tier cannot hold even one chunk of every group ({groups} rows)")
        step = (f"One step's store job (up to {per_step} rows) is larger than the CPU primary tier "
                f"({rows} rows); a refused job is retried with the next step's chunks added, so "
                f"once refused it only grows and nothing is ever stored. Grow the tier to ≥ {need} rows "
                f"({per_step} + {th.row_margin:.0%} margin)" + bytes_for(need, ev, th)
                + f"; or {lower}.")
        if per_step > rows:
            conf = min(conf + 0.05, 0.95)
    else:
        lines.append(f"primary tier: {rows} rows")
        step = (
            "One step's store job (a whole prompt prefilled in one step) is larger than the CPU "
            f"primary tier ({rows} rows): raise cpu_bytes_to_use, or lower "
            "max_num_batched_tokens so a step stores fewer rows."
        )
    marks = [Mark("stores", no_space.samples[-1][0], "no_space")] if no_space.samples else []
    return Finding(
        id=ID,
        title=TITLE,
        confidence=conf,
        evidence=lines,
        next_step=step,
        severity=SEVERITY,
        marks=marks,
    )
