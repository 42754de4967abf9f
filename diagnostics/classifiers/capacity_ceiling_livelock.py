"""Capacity ceiling, livelock form.

The working set is only somewhat larger than the primary tier: no group misses
first, so the request is deferred forever while promotions evict each other,
rewriting about one row budget per step, and nothing is ever restored.

A second form churns slowly: a deferred request that fits the tier, whose own
promotions evict its own earlier ones. The primary tier's lookup does not refresh a hit's
place in the LRU order (0.26 and 0.33), so a request deferred while others stored and loaded
finds its promoted rows the least recently used; on vLLM 0.33 each step it promotes the chunks
it lacks and the allocation evicts another of its own (two chunks a step on the CPU harness, at
10 % fewer rows than ``kv-diagnose plan`` asks for: ``benchmarks/README.md``,
``own_rows_probe.py``; 0.26 ends that workload, for a reason not found). The rate is far below
a row budget per step; what gives it away is the count: its keys promoted over and over,
and never a restore.
"""

from __future__ import annotations

from kvscope.exporters import signals as S

from ..checks import tiered
from ..evidence import Evidence
from ..model import Finding, Mark
from ..thresholds import Thresholds
from ._common import n, rows_needed, window_word

ID = "capacity_ceiling_livelock"
TITLE = "Capacity ceiling (livelock form)"
SEVERITY = 78
CHECK = "requests deferred again and again while promotions churn the primary tier (livelock)"
EXPLAINS = frozenset({"rounds", "coverage"})


def needs(ev: Evidence) -> tuple:
    """Promotions exist only with a secondary tier (a CPU-only engine cannot churn)."""
    base = (S.LOOKUP_ROUNDS, S.PRIMARY_ROWS, S.SCHEDULER_STEPS)
    return base + ((S.PROMOTIONS,) if tiered(ev) else ())


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    return _churn(ev, th) or _self_evicting(ev, th)


def _churn(ev: Evidence, th: Thresholds) -> Finding | None:
    r = ev.rounds
    deferred = r.get(S.Verdict.DEFERRED)
    hit = r.get(S.Verdict.HIT)
    rows = ev.primary_rows
    started = ev.tiers.promotion(S.PromotionResult.STARTED)
    if deferred.increase < th.livelock_min_deferred_rounds or rows <= 0:
        return None
    nothing_window = hit.increase == 0 and r.hit_tokens.increase == 0
    # A scrape sees lifetime totals: an engine that restored once and is stuck
    # now shows deferrals and promotions, and no hit, between the two scrapes.
    nothing_recent = deferred.recent > 0 and hit.recent == 0 and started.recent >= rows
    if not (nothing_window or nothing_recent):
        return None
    steps = ev.freshness.steps.increase
    window_promos = started.recent if (nothing_recent and not nothing_window) else started.increase
    window_steps = ev.freshness.steps.recent if (nothing_recent and not nothing_window) else steps
    if window_promos < 2 * rows:
        return None  # the tier did not even turn over twice: not a churn
    per_step = window_promos / window_steps if window_steps > 0 else None
    # The churn rate is a proxy for "the deferred request needs more rows than
    # the tier has". kvscope_last_round_request_keys says so exactly; with it
    # (and rounds that hit the row ceiling), the rate is not needed: idle steps
    # of a window that also covers calm periods would only dilute it.
    rk = r.request_keys(S.Verdict.DEFERRED)
    exact = rk.present and rk.max > rows and r.ceiling(S.Verdict.DEFERRED).increase > 0
    if not exact and per_step is not None and per_step < th.livelock_churn_fraction * rows:
        return None
    w = window_word(ev)
    conf = 0.6
    lines = [
        f"{n(deferred.increase)} deferred rounds {w}, {n(hit.increase)} hit rounds, "
        f"{n(r.hit_tokens.increase)} tokens offered to load",
    ]
    if nothing_recent and not nothing_window:
        lines.append(
            f"still happening: +{n(deferred.recent)} deferred, +0 hit rounds in the last "
            f"{ev.source.recent_span:.0f} s"
        )
    if per_step is not None:
        lines.append(
            f"promotions churn {n(per_step)} rows per scheduler step "
            f"({n(window_promos)} promotions in {n(window_steps)} steps; primary tier: {n(rows)} rows)"
        )
        if per_step >= 0.5 * rows:
            conf += 0.1
    else:
        lines.append(f"{n(window_promos)} promotions for a {n(rows)}-row primary tier")
    ceil = r.ceiling(S.Verdict.DEFERRED)
    pk = r.pending_keys(S.Verdict.DEFERRED)
    if ceil.increase > 0 or (pk.present and pk.max >= rows):
        conf += 0.2
        lines.append(
            f"{n(ceil.increase)} deferred rounds at the row ceiling; latest deferred pending-key "
            f"sum {n(pk.last)} vs {n(rows)} rows"
        )
    no_row = ev.tiers.promotion(S.PromotionResult.NO_ROW).increase
    if no_row > 0:
        lines.append(f"{n(no_row)} promotions found no free row")
    waiting = ev.requests.get(S.RequestState.DEFERRED)
    if waiting.present and waiting.last > 0:
        conf += 0.05
        lines.append(f"{n(waiting.last)} requests deferred now")
    if rk.present and rk.max > 0:
        lines.append(
            f"the deferred request covers {n(rk.max)} chunk keys over {ev.kv_group_count} KV "
            f"group{'s' if ev.kv_group_count != 1 else ''}: more than the {n(rows)} rows, so its "
            "promotions evict each other" if rk.max > rows else
            f"the deferred request covers {n(rk.max)} chunk keys ({n(rows)} rows)"
        )
    _, step = rows_needed(ev, th, (S.Verdict.DEFERRED,))
    marks = []
    if started.samples:
        marks.append(Mark("promotions", started.samples[-1][0], "churn, no restore"))
    return Finding(
        id=ID,
        title=TITLE,
        confidence=min(conf, 0.95),
        evidence=lines,
        next_step=step[0].upper() + step[1:] + (
            ". Until then these requests wait forever: they are not queued, they are livelocked."
            if waiting.present and waiting.last > 0 else
            ". No request is deferred now: those caught in it left only when a group missed "
            "first and vetoed the restore (recomputed from scratch)."
        ),
        severity=SEVERITY,
        marks=marks,
    )


def _self_evicting(ev: Evidence, th: Thresholds) -> Finding | None:
    """The requests deferred now fit the tier, yet their keys were promoted twice over (and
    completed: not a stalled promotion) with no restore: they evict their own rows."""
    r = ev.rounds
    deferred, hit = r.get(S.Verdict.DEFERRED), r.get(S.Verdict.HIT)
    rows = ev.primary_rows
    waiting = ev.requests.get(S.RequestState.DEFERRED)
    rk = r.request_keys(S.Verdict.DEFERRED)
    if (deferred.increase < th.livelock_min_deferred_rounds or rows <= 0
            or not (waiting.present and waiting.last > 0) or not (rk.present and 0 < rk.max <= rows)):
        return None
    completed = ev.tiers.promotion(S.PromotionResult.COMPLETED)
    w = window_word(ev)
    if hit.increase == 0 and r.hit_tokens.increase == 0:
        promos, steps, when = completed.increase, ev.freshness.steps.increase, w
    elif deferred.recent > 0 and hit.recent == 0:
        # restores earlier (other requests), none lately: judge the recent part alone
        promos, steps = completed.recent, ev.freshness.steps.recent
        when = f"in the last {ev.source.recent_span:.0f} s"
    else:
        return None
    keys = waiting.max * rk.max  # at most this many keys the deferred requests cover
    if promos < 2 * keys:
        return None  # each key promoted at most about once: a restore on its way
    lines = [
        f"{n(deferred.increase)} deferred rounds {w}, {n(hit.increase)} hit rounds "
        f"({n(hit.recent)} in the last {ev.source.recent_span:.0f} s)",
        f"{n(promos)} promotions completed {when} for {n(waiting.max)} deferred "
        f"request{'s' if waiting.max != 1 else ''} covering at most {n(keys)} chunk keys: each "
        f"key promoted {promos / keys:.1f} times over, and no restore",
        f"the deferred request covers {n(rk.max)} chunk keys: it fits the {n(rows)}-row primary "
        "tier, so the rows it loses go to its own promotions (each evicts one of its earlier "
        "ones), not to a tier too small for it",
        f"{n(waiting.last)} request{'s' if waiting.last != 1 else ''} deferred now",
    ]
    if steps > 0:
        lines.append(f"{n(promos / steps)} promotions per scheduler step ({n(steps)} steps): "
                     "a slow churn, below the row budget a step of the other form rewrites")
    _, step = rows_needed(ev, th, (S.Verdict.DEFERRED,))
    started = ev.tiers.promotion(S.PromotionResult.STARTED)
    marks = [Mark("promotions", started.samples[-1][0], "own rows churn, no restore")] \
        if started.samples else []
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.8,
        evidence=lines,
        next_step=(
            "These requests wait forever: they are not queued, they are livelocked on their "
            "own rows. `kv-diagnose plan` sizes the tier for every restore at once (then none "
            f"is left deferred while the others store and load); at the least, {step}."
        ),
        severity=SEVERITY,
        marks=marks,
    )
