"""The coverage model of ``kv-diagnose plan``: how many primary rows a target coverage needs.

**Coverage** is the share of the re-asked prefixes' held tokens that were restored rather
than recomputed: tokens the connector loaded from the offload tiers / tokens the tiers held
for those prefixes when each lookup round ended (kvscope's ``kvscope_hit_tokens_total /
kvscope_restore_held_tokens_total``; the CPU check reads the same from vLLM and the tiers).

**The model.** A restore from disk pins one primary row per chunk of its held prefix in every
KV group (``k = groups x ceil(held tokens / chunk tokens)`` rows) from its promotion until its
load: every restore asking at the same time needs its rows at once. A sliding-window group is
scanned from the prefix's end after the full groups; where a promotion the scan started counts
toward its window (0.33, 0.34: ``kvscope_kv_group_info{restore_chunks}``), it promotes its
window's chunks alone (one Gemma2-style restore of 1,024 tokens, window 128, ended whole in 72
rows on 0.34, the model's 64 + 9 = 73); on 0.26 it promotes every chunk it scans, and
restores asking at once need a row per chunk of it too. vLLM gives the rows first
come, first served. A restore whose first promotion finds no free row is cut there, for a
request asked at once with others at its first chunk (0 tokens: all recomputed, the
concurrency form of the capacity ceiling). A restore whose promotions found rows for part of
its prefix is not cut: the group that promoted answers RETRY (0.26) or HIT_PENDING (0.33),
the request is deferred, visited first at every later step, and promotes the rest of its
prefix when the others' loads free their rows, if what it found reached every KV group's
first chunk (groups are scanned in turn: a group left without a row answers 0 and vetoes the
request, the cross-group AND). So with ``C`` restores asking at once, ``R`` rows restore
``ceil(R / k)`` of them whole for one KV group (``floor(R / k)``, plus the partial one when
its rows reached the last group, for several) and the coverage is that over ``C`` (at most 1),
times the share of held tokens lost for reasons rows do not fix (vLLM's load cap,
quarantined keys). At least ``floor(R / k) / C``: the deferred restore is cut instead when a
recompute's stores take its first rows before it loads. More is possible below the plan:
a restore cut late can find rows the first loads freed (a race of the tiers' threads
against the steps, traced in ``benchmarks/README.md``).

**C from a window.** The restores seen at once (latest-value gauges: a lower bound), and, when
the row ceiling cut restores, the ``C`` that explains the coverage measured: ``W_now`` whole
restores (counted as above) out of ``C`` left ``1 - W_now / C`` of the held tokens to the row
ceiling, so ``C = W_now / (1 - row-ceiling share)``. The larger is taken. Which count
``W_now`` is, the window says: where ``floor(R / k)`` with the restores seen at once explains
the coverage and ``ceil(R / k)`` would need more restores at once than were seen, the partial
restore was cut (four 64,000-token re-asks through 9,000 rows on an H200 restored 2 of 4
whole, the first asker cut too), and the predictions follow that rule. A third reading:
one step's store job held rows while the restores asked (twelve 6,000-token re-asks through
2,250 rows on an H100, k = 750, restored 2 whole, not 3): the count of the rows less that
headroom, taken only where the first two need more restores at once than were seen. A ``C``
above what was seen is said in a note, and ``C`` is never more than the restores the window
had (its restores found fewer free rows than the tier has: the note says so).

**Which partial-restore rule.** The restore that found part of its rows waits for the rest
only if no recompute's stores take the rows the first loads free: where every restore asking
at once finds rows, none is recomputed and it waits (four 64,000-token re-asks on an H200,
k = 4,000: 3 x 4,000 + 256 rows restored all four whole); where some find none, the window's
engine shows whether it was cut (at 9,000 and 12,000 rows the same engine restored 2 of 4).

**The plan.** ``n = ceil(target x C)`` restores whole at once. When that is every restore
(``n = ceil(C)``): ``(n - 1) x k`` rows and the last one's first chunk in every KV group
(:func:`rows_for_every_restore`); else ``n x k`` (the restores that find every row). At least
the largest restore seen, plus headroom for one step's store job (``groups x ceil(
max_num_batched_tokens / chunk tokens)`` rows a prefill step stores, pinned until written):
``cpu_bytes_to_use = rows x row bytes``. Checked against vLLM's scheduler on CPU:
``benchmarks/plan_verify.py``.
"""

from __future__ import annotations

import math

from ..classifiers._common import n, nbytes
from ..model import DiagnoseError
from .model import Fact, Plan, PlanInputs, Prediction, Step

DEFAULT_TARGET = 0.99
SHORT_BY = 0.10  # the plan is also predicted at this much fewer rows
EPS = 1e-9


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def count(x: float, word: str) -> str:
    """``12 rows``, ``1 row``."""
    return f"{n(x)} {word}{'' if x == 1 else 's'}"


def group_rows(held_tokens: float, chunk_tokens: float, kv_groups: float,
               restore_caps: tuple[int, ...] = ()) -> list[int]:
    """Rows one restore of ``held_tokens`` pins at once in each KV group, in the order
    vLLM's lookup scans them: a row per chunk of every full group, then each sliding-window
    group whose restore promotes its window alone (``restore_caps``, widest first) at most
    its cap."""
    chunks = max(1, math.ceil(held_tokens / chunk_tokens - EPS))
    capped = scan_order_caps(restore_caps, kv_groups)
    return [chunks] * (int(kv_groups) - len(capped)) + [min(chunks, c) for c in capped]


def scan_order_caps(restore_caps: tuple[int, ...], kv_groups: float) -> list[int]:
    """The capped groups' caps in the order vLLM scans them (widest window first), at most
    one per KV group."""
    return sorted(restore_caps, reverse=True)[:int(kv_groups)]


def rows_per_restore(held_tokens: float, chunk_tokens: float, kv_groups: float,
                     restore_caps: tuple[int, ...] = ()) -> int:
    """Rows one restore of ``held_tokens`` pins at once (:func:`group_rows`, summed)."""
    return sum(group_rows(held_tokens, chunk_tokens, kv_groups, restore_caps))


def partial_reach(per_group: list[int]) -> int:
    """The fewest rows of its ``k`` (``per_group``: :func:`group_rows`) a restore that finds
    only part of them needs to wait for the rest: groups are scanned in turn, so every group
    before the last whole and the last one's first chunk; with fewer, a group left without a
    row vetoes it (the cross-group AND: cut)."""
    return sum(per_group[:-1]) + 1


def restores_whole(rows: int, k: int, reach: int = 1) -> int:
    """Restores of ``k`` rows that ``rows`` primary rows end whole when all ask at once: the
    ones that found every row, and the one that found part of them when they reach
    ``reach`` (:func:`partial_reach`: every group's first chunk; it waits for the rest)."""
    whole, left = divmod(rows, k)
    return whole + (1 if left >= reach else 0)


def coverage_at(rows: int, k: int, concurrency: float, other_loss: float = 0.0,
                reach: int = 1, partial_cut: bool = False,
                store_rows: int = 0) -> tuple[float, float]:
    """(predicted coverage, at least) of ``rows`` primary rows for ``concurrency``
    restores of ``k`` rows asking at once (see the module docstring). ``partial_cut``: the
    window showed the restore that found part of its rows cut while others were recomputed;
    it is predicted so wherever a restore finds no row (where every restore finds rows,
    none is recomputed and the last one waits). ``store_rows``: rows the window showed
    pinned by in-flight stores while the restores asked (one step's store job), not
    theirs to take."""
    keep = 1.0 - other_loss
    c = max(concurrency, 1.0)
    rows = max(0, rows - store_rows)
    if rows < k:  # not one restore fits: truncated to the rows at best, or livelocked
        return keep * min(1.0, rows / k / c), 0.0
    waits, cut = restores_whole(rows, k, reach), rows // k
    at_least = keep * min(1.0, cut / c)
    if partial_cut and waits < math.ceil(c - EPS):
        return at_least, at_least
    return keep * min(1.0, waits / c), at_least


def rows_for_every_restore(restores: int, k: int, reach: int = 1) -> int:
    """The fewest rows that end ``restores`` restores of ``k`` rows whole when they ask at
    once and no other restore asks with them: the last finds part of its rows and waits for
    the others' loads (no recompute's stores take the rows they free). Its part must reach
    every KV group's first chunk (:func:`partial_reach`), or the cross-group AND cuts it."""
    if restores <= 1:
        return k
    return (restores - 1) * k + reach


def headroom_covers_short_by(rows: int, reserve: int) -> bool:
    """Whether the headroom for one step's stores is ``SHORT_BY`` of the plan or more: then,
    with nothing else storing while the restores wait, that many fewer rows can still reach
    the target (the plan says so in a note)."""
    return reserve >= SHORT_BY * rows


def _v(f: Fact | None, default: float = 0.0) -> float:
    return f.value if f is not None else default


def make_plan(inputs: PlanInputs, target: float = DEFAULT_TARGET,
              predict: tuple[int, ...] = ()) -> Plan:
    """The primary rows (and cpu_bytes_to_use) for ``target`` coverage, with its reasoning
    and the coverage predicted at the rows now, the plan, 10 % fewer and ``predict``."""
    if not 0 < target <= 1:
        raise DiagnoseError(f"--target must be in (0, 1] or (0 %, 100 %] (got {target:g})")
    i = inputs
    if i.held_per_restore is None:
        raise DiagnoseError("cannot plan: the window has no restore the tiers held a prefix "
                            "for; pass --held-tokens (and --concurrency) for the load you expect")
    if i.chunk_tokens is None:
        raise DiagnoseError("cannot plan: tokens per chunk unknown (kvscope_info has no "
                            "chunk_tokens); pass --chunk-tokens")
    steps: list[Step] = []
    notes = list(i.notes)
    g, t, h = int(i.kv_groups.value), i.chunk_tokens.value, i.held_per_restore.value
    groups = f"{g} KV group{'s' if g != 1 else ''}"
    if i.restores is not None and i.held_per_restore.source != "--held-tokens":
        steps.append(Step("held prefix per restore",
                          f"{n(h * i.restores.value)} tokens held / {count(i.restores.value, 'restore')}",
                          f"{n(round(h, 1))} tokens"))
    per_group = group_rows(h, t, g, i.restore_caps)
    k, reach = sum(per_group), partial_reach(per_group)
    chunks = f"⌈{n(round(h, 1))} / {n(t)} tokens per chunk⌉"
    caps = scan_order_caps(i.restore_caps, g)
    if caps:
        # a sliding-window group promotes its window alone (vLLM 0.33+): fewer rows than
        # the prefix's chunks, and vLLM scans it after the full groups
        full = f"{count(g - len(caps), 'full KV group')} × {chunks} + " if g > len(caps) else ""
        how = (f"k = {full}" + " + ".join(f"min({chunks}, {n(c)})" for c in caps)
               + " (a sliding-window group promotes its window)")
    else:
        how = f"k = {groups} × {chunks}"
    steps.append(Step("rows per restore", how, count(k, "row")))
    largest = int(_v(i.largest_rows))
    if largest > k:
        notes.append(f"the largest restore seen needed {n(largest)} rows ({i.largest_rows.source}),"
                     f" more than the mean's {n(k)}: restores differ in length; the plan keeps "
                     "room for the largest, the coverage model counts mean-sized restores")

    # read before C (a window's stores may have held that many rows), said where it was
    reserve, reserve_step, reserve_note = _reserve(i, g, t)
    (c, partial_cut, store_rows), other = (_concurrency(i, k, reach, reserve, steps, notes),
                                           _v(i.other_loss))
    keep = 1.0 - other
    if other > 0:
        steps.append(Step("lost whatever the rows", "load cap, other (of held tokens)", pct(other)))
    reachable = target <= keep + EPS
    whole = math.ceil(c - EPS)
    if reachable:
        need = min(whole, max(1, math.ceil(target / keep * c - EPS)))
        steps.append(Step(f"restores whole at once for {pct(target)}",
                          f"⌈{pct(target)}{f' / {pct(keep)}' if other else ''} × {n(round(c, 2))}⌉",
                          n(need)))
    else:
        need = whole
        notes.append(f"{pct(target)} is out of reach with rows alone: {pct(other)} of the held "
                     f"tokens are lost for reasons rows do not fix; planned for every restore "
                     f"whole ({pct(keep)})")
        steps.append(Step("restores whole at once (all)", f"⌈{n(round(c, 2))}⌉", n(need)))
    if reserve_step is not None:
        steps.append(reserve_step)
    if reserve_note is not None:
        notes.append(reserve_note)
    if need >= whole and need > 1:
        # Every restore asking at once ends whole: none is recomputed, so no recompute's
        # stores take the rows the first loads free, and the last restore, finding part of
        # its rows, waits for them (four 64,000-token re-asks on an H200 restored whole at
        # 3 x 4,000 + 256 rows, and 2 of 4 at 3 x 4,000, where one was recomputed).
        fewest = rows_for_every_restore(need, k, reach)
        how_fewest = f"({n(need)} - 1) × {n(k)} + {n(fewest - (need - 1) * k)}"
        steps.append(Step("rows for every restore whole", f"{how_fewest} (none recomputed: "
                          "the last one waits for its rows)", n(fewest)))
    else:
        # Some restores are recomputed: their stores can take the rows the partial restore
        # waits for (the window's engines cut it so): size for the restores that find
        # every row.
        fewest, how_fewest = need * k, f"{n(need)} × {n(k)}"
    base = max(fewest, largest, k)
    rows = base + reserve
    how = how_fewest if base == fewest else f"the largest restore, {n(largest)}"
    if headroom_covers_short_by(rows, reserve):
        notes.append(f"the headroom for one step's stores ({n(reserve)} rows) is "
                     f"{pct(reserve / rows)} of the plan: with no other request storing "
                     f"while the restores wait, {n(rows - reserve)} rows are enough, and "
                     f"{SHORT_BY:.0%} fewer than the plan can still reach the target")
    steps.append(Step("primary rows", f"{how} + {n(reserve)} headroom", n(rows)))
    cpu_bytes = None
    if i.row_bytes is not None:
        rb = int(i.row_bytes.value)
        cpu_bytes = rows * rb
        steps.append(Step("cpu_bytes_to_use", f"{n(rows)} rows × {nbytes(rb)} ({i.row_bytes.source})",
                          f"≥ {cpu_bytes} ({nbytes(cpu_bytes)})"))
    else:
        notes.append("row bytes unknown (kvscope_primary_row_bytes missing): cpu_bytes_to_use = "
                     "rows × row bytes; pass --row-bytes")

    if (i.coverage_now is not None and i.coverage_now.value >= target - EPS
            and _v(i.row_loss) == 0 and i.rows_now is not None):
        notes.append(f"the window's coverage ({pct(i.coverage_now.value)}) already reaches the "
                     f"target with {n(i.rows_now.value)} rows: the plan is the model's size for "
                     "the restores seen at once (a lower bound), not a change to make")
    preds = []
    seen: set[int] = set()

    def add(r: int, label: str, measured: float | None = None) -> None:
        if r <= 0 or r in seen:
            return
        seen.add(r)
        predicted, at_least = coverage_at(r, k, c, other, reach, partial_cut, store_rows)
        preds.append(Prediction(r, predicted, at_least, label, measured))

    if i.rows_now is not None:
        add(int(i.rows_now.value), "now", i.coverage_now.value if i.coverage_now else None)
    add(rows, "plan")
    add(math.floor(rows * (1 - SHORT_BY)), f"plan - {SHORT_BY:.0%}")
    for r in predict:
        add(int(r), "asked")
    return Plan(inputs=i, target=target, rows_per_restore=k, partial_reach=reach,
                concurrency=c, reserve=reserve,
                restores_needed=need, rows=rows, partial_cut=partial_cut,
                window_store_rows=store_rows, cpu_bytes=cpu_bytes,
                reachable=reachable,
                steps=tuple(steps), predictions=tuple(sorted(preds, key=lambda p: p.rows)),
                notes=tuple(notes))


def _concurrency(i: PlanInputs, k: int, reach: int, reserve: int, steps: list[Step],
                 notes: list[str]) -> tuple[float, bool, int]:
    """(C, whether the window shows the restore that found part of its rows cut, rows the
    window shows its in-flight stores held): restores asking for rows at once (see the
    module docstring)."""
    if i.concurrency_given is not None:
        c = i.concurrency_given.value
        steps.append(Step("restores asking at once", "--concurrency", f"C = {n(c)}"))
        return c, False, 0
    seen = _v(i.concurrency_seen)
    parts = [f"{n(seen)} seen at once ({i.concurrency_seen.source})"] if seen else []
    fit, partial_cut, store_rows = 0.0, False, 0
    row_loss, rows_now = _v(i.row_loss), int(_v(i.rows_now))
    if row_loss > 0 and rows_now >= k:
        left = 1 - row_loss

        def explain(whole: int) -> float:
            return whole / left if row_loss < 1 else float(whole + 1)

        # Which reading of the window's rows: the one whose C the restores seen at once
        # explain, in this order. The partial restore waits; it was cut (the engine cut it
        # before the others' loads freed rows); or one step's store job held rows while
        # the restores asked (12 Gemma2-style re-asks of 6,000 tokens through 2,250 rows
        # on an H100, k = 750: 2 whole, not 3). Taking the first reading where a later one
        # fits would invent restores at once the window never saw, and size the plan for
        # them (C = 18 there, a plan 25 % above what restored all twelve).
        readings = [(0, False), (0, True)] + ([(reserve, False), (reserve, True)]
                                               if 0 < reserve < rows_now else [])

        def whole_of(pinned: int, cut: bool) -> int:
            r = rows_now - pinned
            return r // k if cut else restores_whole(r, k, reach)

        store_rows, partial_cut = next(
            ((p, cut) for p, cut in readings
             if seen > 0 and explain(whole_of(p, cut)) <= seen + EPS), (0, False))
        fitting = whole_of(store_rows, partial_cut)
        free = (f"({n(rows_now)} rows - {n(store_rows)} held by a step's stores)"
                if store_rows else f"{n(rows_now)} rows")
        why = []
        if partial_cut:
            why.append("the restore that found part of its rows was cut")
        if store_rows:
            why.append("in-flight stores held one step's rows while the restores asked")
        how = (f"⌊{free} / {n(k)}⌋" if whole_of(store_rows, True) == fitting
               else f"⌈{free} / {n(k)}⌉ (the last waits for its rows)")
        if why:
            how += f" ({'; '.join(why)}: the C seen explains the coverage so)"
        steps.append(Step("restores the tier holds whole now", how, n(fitting)))
        steps.append(Step("coverage the row ceiling left", f"1 - {pct(row_loss)} of held "
                          "tokens cut by a promotion without a free row", pct(left)))
        fit = explain(fitting)
        parts.append(f"{n(fitting)} / {pct(left)} = {n(round(fit, 2))} to explain the cut")
        restores = _v(i.restores)
        if restores and fit > restores + EPS:
            # more restores at once than the window had at all: the restores found fewer
            # free rows than the tier has (12 re-asks of 6,000 tokens through 2,250 rows on
            # vLLM's CPU scheduler restored 1 whole, a C of 36)
            notes.append(f"the coverage the row ceiling left would need C = {n(round(fit, 2))} "
                         f"restores at once, more than the {n(restores)} the window had: its "
                         "restores found fewer free rows than the tier has (held by in-flight "
                         f"stores or by requests it did not restore); C = {n(restores)}")
            parts.append(f"at most the {n(restores)} restores in the window")
            fit = restores
        if fit > seen + EPS:
            notes.append(f"C = {n(round(fit, 2))} restores at once explains the coverage the "
                         f"row ceiling left, more than the {n(seen)} seen at once (a latest-"
                         "value lower bound): the plan is sized for restores the window did "
                         "not show together; pass --concurrency if you know better")
    elif row_loss > 0:
        notes.append(f"one restore needs {n(k)} rows, more than the {n(rows_now)} the tier has "
                     "(the truncated form): how many ask at once is known only from the gauges")
    elif i.coverage_now is not None:
        notes.append("no restore was cut by the row ceiling in the window: restores asking at "
                     "once are known only from latest-value gauges (a lower bound); pass "
                     "--concurrency for the load you expect")
    c = max(seen if fit <= seen + EPS else fit, 1.0)  # a float's last digit is no restore
    if not parts:
        parts = ["none seen: 1"]
    steps.append(Step("restores asking at once", "C = max(" + "; ".join(parts) + ")",
                      f"C = {n(round(c, 2))}"))
    return c, partial_cut, store_rows


def _reserve(i: PlanInputs, g: int, t: float) -> tuple[int, Step | None, str | None]:
    """Headroom for one step's store job (``--reserve-rows``, else a row per chunk of
    ``max_num_batched_tokens`` in every KV group, 0 when that is unknown), with its reasoning
    line or its note."""
    if i.reserve_given is not None:
        r = int(i.reserve_given.value)
        return r, Step("headroom for stores", "--reserve-rows", count(r, "row")), None
    if i.step_tokens is None:
        return 0, None, ("max_num_batched_tokens unknown: no headroom for in-flight stores "
                         "(pass --reserve-rows or --step-tokens)")
    r = g * math.ceil(i.step_tokens.value / t - EPS)
    return r, Step("headroom for one step's stores", f"{g} × ⌈{n(i.step_tokens.value)} "
                   f"tokens per step / {n(t)}⌉", count(r, "row")), None
