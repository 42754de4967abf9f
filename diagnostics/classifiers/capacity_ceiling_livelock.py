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

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark
from ..thresholds import Thresholds
from ._common import n
from .needs import tiered
from .shared_facts import RowSizing, window_phrase

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


@dataclass(frozen=True)
class ChurnFacts(Facts):
    """The fast form: promotions evict each other about a row budget per step."""

    lifetime: bool
    deferred_rounds: float
    hit_rounds: float
    hit_tokens: float
    recent_only: bool  # judged on the recent span alone (restores earlier, none lately)
    recent_deferred_rounds: float
    recent_span_s: float
    promotions: float  # promotions started in what was judged (the window or its recent span)
    steps: float  # scheduler steps in it
    primary_rows: float
    deferred_at_ceiling: float  # deferred rounds at the row ceiling
    pending_keys_last: float | None  # the latest deferred round's pending-key sum
    pending_keys_max: float | None
    promotions_no_row: float
    deferred_now: float | None  # requests deferred now; None: the gauge is absent
    request_keys: float | None  # chunk keys of the largest deferred request; None: unknown
    kv_groups: int
    sizing: RowSizing

    @property
    def per_step(self) -> float | None:
        """Rows the promotions rewrite per scheduler step."""
        return self.promotions / self.steps if self.steps > 0 else None

    @property
    def at_ceiling(self) -> bool:
        return self.deferred_at_ceiling > 0 or (
            self.pending_keys_max is not None and self.pending_keys_max >= self.primary_rows)

    def lines(self) -> list[str]:
        rows = self.primary_rows
        lines = [
            f"{n(self.deferred_rounds)} deferred rounds {window_phrase(self.lifetime)}, "
            f"{n(self.hit_rounds)} hit rounds, {n(self.hit_tokens)} tokens offered to load",
        ]
        if self.recent_only:
            lines.append(
                f"still happening: +{n(self.recent_deferred_rounds)} deferred, +0 hit rounds in "
                f"the last {self.recent_span_s:.0f} s"
            )
        if self.per_step is not None:
            lines.append(
                f"promotions churn {n(self.per_step)} rows per scheduler step "
                f"({n(self.promotions)} promotions in {n(self.steps)} steps; primary tier: "
                f"{n(rows)} rows)"
            )
        else:
            lines.append(f"{n(self.promotions)} promotions for a {n(rows)}-row primary tier")
        if self.at_ceiling:
            lines.append(
                f"{n(self.deferred_at_ceiling)} deferred rounds at the row ceiling; latest "
                f"deferred pending-key sum {n(self.pending_keys_last or 0)} vs {n(rows)} rows"
            )
        if self.promotions_no_row > 0:
            lines.append(f"{n(self.promotions_no_row)} promotions found no free row")
        if self.deferred_now is not None and self.deferred_now > 0:
            lines.append(f"{n(self.deferred_now)} requests deferred now")
        rk, g = self.request_keys, self.kv_groups
        if rk is not None:
            lines.append(
                f"the deferred request covers {n(rk)} chunk keys over {g} KV "
                f"group{'s' if g != 1 else ''}: more than the {n(rows)} rows, so its "
                "promotions evict each other" if rk > rows else
                f"the deferred request covers {n(rk)} chunk keys ({n(rows)} rows)"
            )
        return lines


@dataclass(frozen=True)
class OwnRowsFacts(Facts):
    """The slow form: a deferred request that fits the tier evicts its own promoted rows."""

    lifetime: bool
    deferred_rounds: float
    hit_rounds: float
    recent_hit_rounds: float
    recent_span_s: float
    recent_only: bool  # judged on the recent span alone (restores earlier, none lately)
    promotions_completed: float  # in what was judged
    steps: float  # scheduler steps in it
    deferred_requests: float  # most requests deferred at once in the window
    deferred_now: float
    request_keys: float  # chunk keys of the largest deferred request (≤ primary_rows)
    keys_covered: float  # deferred_requests × request_keys: at most this many keys
    primary_rows: float
    sizing: RowSizing

    @property
    def promotions_per_key(self) -> float:
        return self.promotions_completed / self.keys_covered

    def lines(self) -> list[str]:
        span = f"{self.recent_span_s:.0f} s"
        when = f"in the last {span}" if self.recent_only else window_phrase(self.lifetime)
        promos, reqs, now = self.promotions_completed, self.deferred_requests, self.deferred_now
        lines = [
            f"{n(self.deferred_rounds)} deferred rounds {window_phrase(self.lifetime)}, "
            f"{n(self.hit_rounds)} hit rounds ({n(self.recent_hit_rounds)} in the last {span})",
            f"{n(promos)} promotions completed {when} for {n(reqs)} deferred "
            f"request{'s' if reqs != 1 else ''} covering at most {n(self.keys_covered)} chunk "
            f"keys: each key promoted {self.promotions_per_key:.1f} times over, and no restore",
            f"the deferred request covers {n(self.request_keys)} chunk keys: it fits the "
            f"{n(self.primary_rows)}-row primary tier, so the rows it loses go to its own "
            "promotions (each evicts one of its earlier ones), not to a tier too small for it",
            f"{n(now)} request{'s' if now != 1 else ''} deferred now",
        ]
        if self.steps > 0:
            lines.append(f"{n(promos / self.steps)} promotions per scheduler step "
                         f"({n(self.steps)} steps): a slow churn, below the row budget a step "
                         "of the other form rewrites")
        return lines


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
    recent_only = nothing_recent and not nothing_window
    window_promos = started.recent if recent_only else started.increase
    window_steps = ev.freshness.steps.recent if recent_only else steps
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
    pk = r.pending_keys(S.Verdict.DEFERRED)
    waiting = ev.requests.get(S.RequestState.DEFERRED)
    facts = ChurnFacts(
        lifetime=ev.source.lifetime,
        deferred_rounds=deferred.increase,
        hit_rounds=hit.increase,
        hit_tokens=r.hit_tokens.increase,
        recent_only=recent_only,
        recent_deferred_rounds=deferred.recent,
        recent_span_s=ev.source.recent_span,
        promotions=window_promos,
        steps=window_steps,
        primary_rows=rows,
        deferred_at_ceiling=r.ceiling(S.Verdict.DEFERRED).increase,
        pending_keys_last=pk.last if pk.present else None,
        pending_keys_max=pk.max if pk.present else None,
        promotions_no_row=ev.tiers.promotion(S.PromotionResult.NO_ROW).increase,
        deferred_now=waiting.last if waiting.present else None,
        request_keys=rk.max if rk.present and rk.max > 0 else None,
        kv_groups=ev.kv_group_count,
        sizing=RowSizing.read(ev, th, (S.Verdict.DEFERRED,)),
    )
    conf = 0.6
    if per_step is not None and per_step >= 0.5 * rows:
        conf += 0.1
    if facts.at_ceiling:
        conf += 0.2
    waits = facts.deferred_now is not None and facts.deferred_now > 0
    if waits:
        conf += 0.05
    step = facts.sizing.sentence()
    marks = []
    if started.samples:
        marks.append(Mark("promotions", started.samples[-1][0], "churn, no restore"))
    return Finding(
        id=ID,
        title=TITLE,
        confidence=min(conf, 0.95),
        facts=facts,
        next_step=step[0].upper() + step[1:] + (
            ". Until then these requests wait forever: they are not queued, they are livelocked."
            if waits else
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
    if hit.increase == 0 and r.hit_tokens.increase == 0:
        promos, steps, recent_only = completed.increase, ev.freshness.steps.increase, False
    elif deferred.recent > 0 and hit.recent == 0:
        # restores earlier (other requests), none lately: judge the recent part alone
        promos, steps, recent_only = completed.recent, ev.freshness.steps.recent, True
    else:
        return None
    keys = waiting.max * rk.max  # at most this many keys the deferred requests cover
    if promos < 2 * keys:
        return None  # each key promoted at most about once: a restore on its way
    facts = OwnRowsFacts(
        lifetime=ev.source.lifetime,
        deferred_rounds=deferred.increase,
        hit_rounds=hit.increase,
        recent_hit_rounds=hit.recent,
        recent_span_s=ev.source.recent_span,
        recent_only=recent_only,
        promotions_completed=promos,
        steps=steps,
        deferred_requests=waiting.max,
        deferred_now=waiting.last,
        request_keys=rk.max,
        keys_covered=keys,
        primary_rows=rows,
        sizing=RowSizing.read(ev, th, (S.Verdict.DEFERRED,)),
    )
    started = ev.tiers.promotion(S.PromotionResult.STARTED)
    marks = [Mark("promotions", started.samples[-1][0], "own rows churn, no restore")] \
        if started.samples else []
    return Finding(
        id=ID,
        title=TITLE,
        confidence=0.8,
        facts=facts,
        next_step=(
            "These requests wait forever: they are not queued, they are livelocked on their "
            "own rows. `kv-diagnose plan` sizes the tier for every restore at once (then none "
            f"is left deferred while the others store and load); at the least, "
            f"{facts.sizing.sentence()}."
        ),
        severity=SEVERITY,
        marks=marks,
    )
