"""Store never fits: one step's store job is larger than the primary tier.

``prepare_store`` refuses the whole job (``no_space``), so nothing from it
reaches any tier, and the disk tier stays empty.

Partial form: some of a prompt's store jobs fit, the rest were refused, so the
prompt is stored only in part; its re-ask restores that part and recomputes the
rest, and the hit counters look fine. The connector names it at the lookup
(``kvscope_restore_short_rounds_total{reason="store_refused"}``: the round's
offer stopped at a chunk whose store job was refused): precise where the
refusal counts alone are not (floods refused and never asked again are harmless).
"""

from __future__ import annotations

import math

from kvscope.exporters import signals as S

from ..checks import tiered
from ..evidence import Evidence, Quantity
from ..model import Finding, Mark
from ..thresholds import Thresholds
from ._common import bytes_for, n, stopping_groups_line, window_word

# Refused store jobs per prepared one above which stores "never fit" even though
# some fit (see classify).
MOSTLY_REFUSED = 5

ID = "store_never_fits"
TITLE = "Store never fits the primary tier"
SEVERITY = 75
CHECK = ("store jobs refused for lack of space with nothing reaching the disk tier, or re-asks "
         "cut at a chunk whose store job was refused (stored in part)")
EXPLAINS = frozenset({"rounds", "coverage"})


def needs(ev: Evidence) -> tuple:
    """Cascades exist only with a secondary tier."""
    return (S.STORE_JOBS, S.PRIMARY_ROWS) + ((S.CASCADES,) if tiered(ev) else ())


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    # Re-asks cut short where their own prompts' store jobs were refused (any window:
    # the refusals may precede it, the recompute is now). Per key, judged by the
    # connector (the offer stopped at a key no tier holds, whose store job was refused):
    # once anything reached the last tier it decides the form, whatever the refusal
    # counts say (a refused job is retried every step, decode steps too, so refusals
    # outnumber prepared jobs many times over while each prompt is stored in part).
    short = ev.coverage.rounds(S.ShortReason.STORE_REFUSED)
    whole = _never_fits(ev, th)
    if short.increase > 0 and (whole is None or _reached(ev)):
        return _partial(ev, th, short)
    return whole


def _reached(ev: Evidence) -> bool:
    """Something reached the last tier: a completed cascade to disk, or, with the CPU
    tier alone (nothing cascades), a store job that fit."""
    if tiered(ev):
        return ev.tiers.cascade(S.CascadeResult.COMPLETED).last > 0
    return ev.tiers.store(S.StoreJobResult.PREPARED).increase > 0


def _never_fits(ev: Evidence, th: Thresholds) -> Finding | None:
    no_space = ev.tiers.store(S.StoreJobResult.NO_SPACE)
    cascaded = ev.tiers.cascade(S.CascadeResult.COMPLETED)
    prepared = ev.tiers.store(S.StoreJobResult.PREPARED).increase
    # A job refused now and then (rows pinned by other requests' stores) is not
    # "never fits".
    reached = _reached(ev)
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
    conf, more, per_step = _job_size(ev, rows, conf)
    lines += more
    if per_step:
        fit_tokens = (rows // ev.kv_group_count) * ev.info_int("chunk_tokens")
        need = _with_margin(per_step, th)
        lower = (f"lower max_num_batched_tokens to ≤ {fit_tokens} (= {rows // ev.kv_group_count} "
                 f"chunks × {ev.info_int('chunk_tokens')} tokens per group: a step's store job "
                 f"then fits {rows} rows, with no room left for restores)" if fit_tokens > 0 else
                 f"the tier cannot hold even one chunk of every group ({ev.kv_group_count} rows)")
        step = (f"One step's store job (up to {per_step} rows) is larger than the CPU primary tier "
                f"({rows} rows); a refused job is retried with the next step's chunks added, so "
                f"once refused it only grows and nothing is ever stored. Grow the tier to ≥ {need} rows "
                f"({per_step} + {th.row_margin:.0%} margin)" + bytes_for(need, ev, th)
                + f"; or {lower}.")
    else:
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


def _partial(ev: Evidence, th: Thresholds, short: Quantity) -> Finding:
    """Prompts stored in part: their re-asks came short at a refused store."""
    c, w = ev.coverage, window_word(ev)
    rows = int(ev.primary_rows)
    no_space = ev.tiers.store(S.StoreJobResult.NO_SPACE)
    prepared = ev.tiers.store(S.StoreJobResult.PREPARED).increase
    lost = c.tokens(S.ShortReason.STORE_REFUSED).increase
    lines = [f"{n(short.increase)} lookup round{'s' if short.increase != 1 else ''} {w} stopped "
             "at a chunk whose store job the primary tier had refused for lack of space: the "
             "prompt was stored only in part"
             + (f", {n(lost)} tokens of it not restored (recomputed)" if lost > 0 else "")]
    held = c.held_tokens.increase if c.held_tokens.present else 0
    if held > 0:
        lines.append(f"{n(ev.rounds.hit_tokens.increase)} tokens offered of {n(held)} the tiers "
                     "held: the restores got what was stored, the stores were cut")
    group = stopping_groups_line(ev, S.ShortReason.STORE_REFUSED,
                                 "its next chunk was never stored (store job refused)")
    if group:
        lines.append(group)
    if no_space.present:
        lines.append(f"{n(no_space.increase)} store jobs refused (no_space) {w}, "
                     f"{n(prepared)} prepared"
                     + ("; the refusals came earlier" if no_space.increase <= 0 else "")
                     + ("; a refused job is retried every step until its request ends, so "
                        "refusals outnumber prepared jobs while each prompt is stored in part"
                        if no_space.increase > MOSTLY_REFUSED * prepared > 0 else ""))
    # Decided per key by the connector: the offer stopped at a key no tier holds whose
    # store job was refused, the tiers holding no more than was offered (a restore the
    # row ceiling cut, the tiers holding more, is the capacity ceiling's finding).
    conf, more, per_step = _job_size(ev, rows, 0.85)
    lines += more
    # A job that fits the tier alone is refused when earlier jobs' rows are still pinned
    # (being written to the primary tier, then copied to the disk tier): room for one
    # more job in flight than the tier holds now.
    need = _with_margin(rows + per_step if per_step else rows * 2, th)
    job = f"a step's store job (up to {per_step} rows)" if per_step else "a step's store job"
    room = f"room for one more job in flight: {rows} + {per_step}" if per_step else "twice that"
    step = (f"Part of each such prompt is recomputed on every re-ask: {job} found no free "
            f"primary row while the prompt was prefilled (rows pinned by earlier jobs still "
            f"being written or copied to the disk tier, by restores, by other requests); once "
            f"refused, a job is retried with the next step's chunks added. Grow the CPU "
            f"primary tier to ≥ {need} rows (now {rows}; {room} + {th.row_margin:.0%} margin)"
            + bytes_for(need, ev, th)
            + "; or lower max_num_batched_tokens so each job needs fewer rows.")
    marks = [Mark("rounds", short.samples[-1][0], "store refused")] if short.samples else []
    return Finding(id=ID, title=TITLE + " (stored in part)", confidence=conf, evidence=lines,
                   next_step=step, severity=SEVERITY, marks=marks)


def _with_margin(rows: int, th: Thresholds) -> int:
    return math.ceil(rows * (1 + th.row_margin) - 1e-9)


def _job_size(ev: Evidence, rows: int, conf: float) -> tuple[float, list[str], int]:
    """(confidence, evidence lines, rows one step's store job can need; 0: unknown)."""
    # One request's store job in one step covers the full chunks its prefill
    # completed in that step, in every KV group: up to
    # ceil(max_num_batched_tokens / chunk_tokens) chunks x groups rows, which
    # prepare_store must find free at once or refuses whole.
    groups = ev.kv_group_count
    chunk = ev.info_int("chunk_tokens")
    batched = ev.info_int("max_num_batched_tokens")
    if not (chunk and batched):
        return conf, [f"primary tier: {rows} rows"], 0
    per_step = math.ceil(batched / chunk) * groups
    line = (f"one step can prefill max_num_batched_tokens={batched} tokens = "
            f"{math.ceil(batched / chunk)} chunks of {chunk} tokens × {groups} KV group"
            f"{'s' if groups != 1 else ''} = {per_step} rows per store job; primary tier: {rows} rows")
    if per_step > rows:
        conf = min(conf + 0.05, 0.95)
    return conf, [line], per_step
