"""What one ended lookup round means: verdict, row ceiling, restore coverage, span.

Once per ``get_num_new_matched_tokens`` call (never per key). A plain round (no
quarantined key, refused promotion or eviction in it; no span) is judged on the
aggregator thread (:meth:`RoundVerdicts.judge_plain`, aggregator.py) from what the
scheduler thread captured when it ended: its lookups summarized (counts, misses, pending
keys, where each group's scan stopped: lookup.rounds.summarize), the request's token
count and the lengths of its offload-key lists (vLLM only appends to them), in
journal order with the step's store jobs (the refused keys coverage reads). Rounds
with rare events are judged as they end, on the scheduler thread after a
synchronous drain (:meth:`RoundVerdicts.record`: their coverage may probe the
tiers, whose contents the step's stores then change). The common verdicts (hit,
miss) cost a coverage judgement and a few sums that :meth:`RoundVerdicts.flush`
hands to the recorder; vetoed and deferred rounds also read the primary tier's row
count (the row ceiling's tells). All of it runs holding the aggregator's lock. The
span of a round judged while tracing is on: ``round_spans.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any

from opentelemetry.trace import Tracer

from kvscope.connector import compat
from kvscope.connector.lookup.coverage import Coverage, group_suffixes, judge, judge_plain_single
from kvscope.connector.lookup.request_states import RequestStates
from kvscope.connector.lookup.round_spans import lookup_round_span
from kvscope.connector.lookup.rounds import Round, RoundFacts, summarize_counted
from kvscope.exporters import signals
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import CeilingForm, ErrorSite, ShortReason, Verdict

_HIT, _VETOED, _DEFERRED = Verdict.HIT, Verdict.VETOED, Verdict.DEFERRED
_MISS_VERDICT = Verdict.MISS
_HIT_LABELS, _MISS_LABELS = (Verdict.HIT.value,), (Verdict.MISS.value,)
_NOTHING: frozenset[bytes] = frozenset()
_REASON_LABELS = {r: (r.value,) for r in ShortReason}
_NOT_STORED = _REASON_LABELS[ShortReason.NOT_STORED]
_STORE_REFUSED = ShortReason.STORE_REFUSED
_FORM_LABELS = {f: (f.value,) for f in CeilingForm}


def _ignore(counts: dict) -> None:
    return None


# A request's offload-key lists per KV group and their lengths when its round ended
Offload = tuple[Sequence[list[bytes]], tuple[int, ...]]


def offload_of(keys: Any, lengths: int | tuple[int, ...] | None) -> Offload | None:
    """What compat.offload_prefix_capture captured, as an :data:`Offload`: one KV group's
    list and its length (an int; no tuples built on vLLM's thread), several groups'
    lists and lengths, or nothing (None)."""
    if lengths is None:
        return None
    if type(lengths) is int:
        return (keys,), (lengths,)
    return keys, lengths


class RoundVerdicts:
    def __init__(self, *, recorder: Recorder, tracer: Tracer, connector_scheduler: Any,
                 primary: Any, requests: RequestStates,
                 refused_stores: Container[bytes] = (),
                 count_lookups: Callable[[dict], None] = _ignore,
                 count_counted: Callable[[tuple], None] = _ignore) -> None:
        """``count_lookups``: told a plain round's lookup counts (LookupCounts.add);
        ``count_counted``: those of a round handed over counted (LookupCounts.add_counted)."""
        self.rec = recorder
        self.count_lookups = count_lookups
        self.count_counted = count_counted
        self.tracer = tracer
        self.tracing = False  # set by the coordinator (re-checked periodically)
        self.cs = connector_scheduler
        self.primary = primary
        self.requests = requests
        self.refused_stores = refused_stores  # keys whose store job found no primary row
        # (key suffix, tokens per chunk, sliding window) per KV group
        self.groups = group_suffixes(compat.lookup_groups(connector_scheduler))
        # tokens per chunk of the only KV group when it is full attention, else 0:
        # then a round without refusals or quarantined keys takes judge_plain_single
        only = self.groups[0] if len(self.groups) == 1 else None
        self._single_tpc = only[1] if only is not None and only[1] > 0 and not only[2] else 0
        # Sums of the common path since the last flush, handed to the recorder by flush()
        self._rounds: dict[tuple[str], int] = {}  # verdict label -> rounds
        self._hit_tokens = 0
        self._held_tokens = 0
        self._coverages: list[float] = []
        self._short_rounds: dict[tuple[str], int] = {}  # reason label -> rounds
        self._short_tokens: dict[tuple[str], int] = {}  # reason label -> tokens
        # (kv_group, reason) labels per group index, then reason; and their round sums
        self._stop_labels = [{r: (str(g), r.value) for r in ShortReason}
                             for g in range(len(self.groups))]
        self._stopped: dict[tuple[str, str], int] = {}

    def declare(self) -> None:
        rec, one = self.rec, lambda enum: [(v.value,) for v in enum]
        rec.declare(signals.LOOKUP_ROUNDS, *one(Verdict))
        rec.declare(signals.ROUNDS_AT_ROW_CEILING,
                    (Verdict.VETOED.value,), (Verdict.DEFERRED.value,))
        rec.declare(signals.HIT_TOKENS)
        rec.declare(signals.RESTORE_HELD_TOKENS)
        rec.declare(signals.RESTORE_SHORT_ROUNDS, *one(ShortReason))
        rec.declare(signals.RESTORE_SHORT_TOKENS, *one(ShortReason))
        rec.declare(signals.RESTORE_CEILING_ROUNDS, *one(CeilingForm))
        rec.declare(signals.RESTORE_STOPPED_ROUNDS,
                    *[labels for by in self._stop_labels for labels in by.values()])
        # The latest-round gauges at 0 (no such round yet) from the first step too, so a
        # value missing from an input is a partial export (signals.PRESET_VALUES); once.
        for v in (_VETOED, _DEFERRED):
            rec.set(signals.LAST_ROUND_PENDING_KEYS, (v.value,), 0)
            rec.set(signals.LAST_ROUND_REQUEST_KEYS, (v.value,), 0)

    def record(self, rnd: Round, rid: str, req_tokens: int, offload: Offload | None,
               num_tokens: int | None, num_computed: int) -> None:
        """A round judged as it ends (rare events in it, or tracing on)."""
        try:
            verdict, pending, rows_total, at_ceiling, cov = self._judge(
                rnd, rid, req_tokens, offload, num_tokens, num_computed)
            self.requests.on_round(rid, req_tokens, verdict is _DEFERRED)
            if self.tracing:
                lookup_round_span(self.tracer, self.primary, rnd, verdict, rid, num_tokens,
                                  pending, rows_total, at_ceiling, cov)
        except Exception as exc:
            self.rec.error(ErrorSite.ROUND, exc)

    def judge_plain(self, rid: str, req_tokens: int, offload: Any,
                    lengths: int | tuple[int, ...] | None, num_tokens: int | None,
                    num_computed: int, counts: dict, facts: RoundFacts,
                    started: float = 0.0, took: float = 0.0) -> None:
        """A plain round (no rare events, no span): the journal's handler, on the
        aggregator thread, from what the scheduler thread captured (``offload``,
        ``lengths``: :func:`offload_of`) and summarized (``counts``: the lookups since the
        last hand-over per group and result, ``facts``: the round's, lookup.rounds.
        summarize). A hit or a miss on one full-attention group (most rounds) is judged
        here as :meth:`_judge` and :meth:`_coverage` would (the same sums; no per-group
        lists, no frames between): per round, calls are what the aggregator's CPU time is
        made of."""
        self.count_lookups(counts)
        self._plain(rid, req_tokens, offload, lengths, num_tokens, num_computed, facts.misses,
                    facts.n, facts.miss_key, facts, started, took)

    def judge_counted(self, rid: str, req_tokens: int, offload: Any,
                      lengths: int | tuple[int, ...] | None, num_tokens: int | None,
                      num_computed: int, counted: tuple, started: float = 0.0,
                      took: float = 0.0) -> None:
        """:meth:`judge_plain` of a round of one KV group handed over as its counts
        (``LookupLog.counted``'s shape: HIT, HIT_PENDING, RETRY, MISS, keys consumed, the
        key of its MISS; the connector's hook, scheduler/hooks.py): the same sums, without
        building the count dict or the round's facts for a hit or a miss (they are built only
        for the general path: lookup.rounds.summarize_counted). Per round, on the aggregator
        thread, or on vLLM's at the step that settles the engine (scheduler.observer.settle)."""
        self.count_counted(counted)
        misses, n = counted[3], counted[4]
        self._plain(rid, req_tokens, offload, lengths, num_tokens, num_computed, misses, n,
                    counted[5] if misses else None, counted, started, took)

    def _plain(self, rid: str, req_tokens: int, offload: Any,
               lengths: int | tuple[int, ...] | None, num_tokens: int | None,
               num_computed: int, misses: int, n: int, miss_key: bytes | None,
               facts: RoundFacts | tuple, started: float, took: float) -> None:
        """:meth:`judge_plain` less the counting: ``facts`` a RoundFacts, or a round's counts
        (:meth:`judge_counted`), made its RoundFacts where the general path needs them."""
        tpc = self._single_tpc
        try:
            # a hit, or a miss (nothing found: else vetoed), of one full-attention group
            if (tpc and num_tokens is not None and type(lengths) is int
                    and (num_tokens > 0 or misses == n)):
                try:  # its own guard: the verdict still counts
                    group_keys, n = offload, lengths
                    if len(group_keys) != n:
                        group_keys = group_keys[:n]
                    if num_tokens and num_tokens >= len(group_keys) * tpc - num_computed:
                        self._held_tokens += num_tokens  # all offered (_full_restore)
                        self._coverages.append(1.0)
                    else:
                        self._count_coverage(judge_plain_single(
                            group_keys, tpc, miss_key,
                            _HIT if num_tokens > 0 else _MISS_VERDICT, num_tokens,
                            num_computed, self.refused_stores))
                except Exception as exc:
                    self.rec.error(ErrorSite.ROUND, exc)
                labels = _HIT_LABELS if num_tokens > 0 else _MISS_LABELS
                self._rounds[labels] = self._rounds.get(labels, 0) + 1
                if num_tokens > 0:
                    self._hit_tokens += num_tokens
            else:
                if type(facts) is tuple:
                    facts = summarize_counted(facts)
                self._judge(facts, rid, req_tokens, offload_of(offload, lengths), num_tokens,
                            num_computed)
        except Exception as exc:
            self.rec.error(ErrorSite.ROUND, exc)
        self.requests.on_round(rid, req_tokens, num_tokens is None)
        if started:
            self.requests.clock.on_round(rid, num_tokens, started, took, n)

    def _judge(self, rnd: Round | RoundFacts, rid: str, req_tokens: int, offload: Offload | None,
               num_tokens: int | None, num_computed: int
               ) -> tuple[Verdict, int, int, bool, Coverage | None]:
        """Verdict, coverage and the row ceiling's tells, into the sums."""
        verdict, labels = rnd.verdict(num_tokens)
        cov = None
        if verdict is not _DEFERRED:
            try:  # its own guard: the verdict still counts
                cov = self._coverage(rnd, verdict, rid, offload, num_tokens or 0,
                                     num_computed)
            except Exception as exc:
                self.rec.error(ErrorSite.ROUND, exc)
        self._rounds[labels] = self._rounds.get(labels, 0) + 1
        at_ceiling = False
        pending = rows_total = 0
        if verdict is _HIT:
            self._hit_tokens += num_tokens
        elif verdict is _VETOED or verdict is _DEFERRED:  # rarer: the row ceiling's tells
            rec = self.rec
            pending = rnd.pending_keys
            rows_total = compat.rows_total(self.primary)
            rec.observe(signals.ROUND_PENDING_KEYS, (), pending)
            rec.set(signals.LAST_ROUND_PENDING_KEYS, labels, pending)
            rec.set(signals.LAST_ROUND_REQUEST_KEYS, labels,
                    self.requests.request_keys(req_tokens))
            at_ceiling = rnd.at_row_ceiling(rows_total)
            if at_ceiling:
                rec.inc(signals.ROUNDS_AT_ROW_CEILING, labels)
        return verdict, pending, rows_total, at_ceiling, cov

    def flush(self) -> None:
        """At each flush: what the rounds since the last one added up to, into the recorder."""
        rec = self.rec
        if self._rounds:
            for labels, n in self._rounds.items():
                rec.inc(signals.LOOKUP_ROUNDS, labels, n)
            self._rounds.clear()
        if self._hit_tokens:
            rec.inc(signals.HIT_TOKENS, (), self._hit_tokens)
            self._hit_tokens = 0
        if self._held_tokens:
            rec.inc(signals.RESTORE_HELD_TOKENS, (), self._held_tokens)
            self._held_tokens = 0
        if self._coverages:
            rec.observe_many(signals.RESTORE_COVERAGE, (), self._coverages)
            self._coverages = []
        for metric, sums in ((signals.RESTORE_SHORT_ROUNDS, self._short_rounds),
                             (signals.RESTORE_SHORT_TOKENS, self._short_tokens),
                             (signals.RESTORE_STOPPED_ROUNDS, self._stopped)):
            if sums:
                for labels, n in sums.items():
                    rec.inc(metric, labels, n)
                sums.clear()

    def _coverage(self, rnd: Round | RoundFacts, verdict: Verdict, req_id: str, offload: Offload | None,
                  offered: int, num_computed: int) -> Coverage | None:
        """Held vs offered tokens of an ended round, recorded. ``offload``: the request's
        offload-key lists and their lengths when the round ended."""
        if not offload:
            return None
        lists, lens = offload
        keys = [k if len(k) == n else k[:n] for k, n in zip(lists, lens, strict=True)]
        if not keys:
            return None
        if offered and not rnd.refusals:
            full = self._full_restore(offered, num_computed, keys)
            if full is not None:  # the healthy case: no judging needed
                return full
        if self._single_tpc and not rnd.refusals and not rnd.quarantined:  # most rounds
            cov = judge_plain_single(
                keys[0], self._single_tpc, rnd.first_miss_key(), verdict, offered, num_computed, self.refused_stores)
        else:  # which groups were scanned matters only past a refused promotion
            cov = judge(first_miss=rnd.first_miss(),
                        scanned=rnd.scanned() if rnd.refusals else _NOTHING,
                        verdict=verdict, offered=offered, num_computed=num_computed,
                        groups=self.groups, keys_by_group=keys, manager=self.cs.manager,
                        refused_stores=self.refused_stores)
        if cov is None:
            return None
        self._count_coverage(cov)
        if cov.reason is None:
            return cov
        rec = self.rec
        if cov.refused and cov.held > cov.offered:  # rare: the row ceiling cut this restore
            others = self.requests.restoring_others(req_id)
            need = self.requests.need
            rec.set(signals.LAST_CEILING_OFFERED_TOKENS, (), cov.offered)
            rec.set(signals.LAST_CEILING_HELD_TOKENS, (), cov.held)
            rec.set(signals.LAST_CEILING_ROWS_NEEDED, (), cov.rows_needed)
            rec.set(signals.LAST_CEILING_CONCURRENT_REQUESTS, (), 1 + len(others))
            rec.observe(signals.CEILING_CONCURRENT_REQUESTS, (), 1 + len(others))
            rec.set(signals.LAST_CEILING_CONCURRENT_ROWS, (),
                    cov.rows_needed + sum(need.get(r, 0) for r in others))
            # Counted, not only a gauge: an earlier cut round's form must survive later
            # rounds. A prefix that fits the rows alone yet found none free was cut by rows
            # other work pinned (concurrent restores, in-flight stores).
            fits = cov.rows_needed <= compat.rows_total(self.primary)
            rec.inc(signals.RESTORE_CEILING_ROUNDS,
                    _FORM_LABELS[CeilingForm.CONCURRENT if fits else CeilingForm.ALONE])
        return cov

    def _count_coverage(self, cov: Coverage) -> None:
        """A judged round's held tokens, coverage and short-restore reason, into the
        sums :meth:`flush` hands to the recorder (no recorder call per round)."""
        if cov.held > 0:
            self._held_tokens += cov.held
            self._coverages.append(cov.offered / cov.held)
        if cov.reason is None:
            return
        label = _REASON_LABELS[cov.reason]
        rounds, tokens = self._short_rounds, self._short_tokens
        rounds[label] = rounds.get(label, 0) + 1
        if 0 <= cov.group < len(self._stop_labels):  # which group's scan stopped the offer
            by = self._stop_labels[cov.group][cov.reason]
            self._stopped[by] = self._stopped.get(by, 0) + 1
        if cov.held > cov.offered:
            tokens[label] = tokens.get(label, 0) + cov.held - cov.offered
        if cov.want > cov.held:  # beyond the stored prefix: refused stores, or never stored
            label = label if cov.reason is _STORE_REFUSED else _NOT_STORED
            tokens[label] = tokens.get(label, 0) + cov.want - cov.held

    def _full_restore(self, offered: int, num_computed: int,
                      keys: list[list[bytes]]) -> Coverage | None:
        """Coverage of a round that offered the request's whole loadable prefix, or None.

        judge() gives the same there (held = offered >= want, no reason), so the
        healthy restore skips it: the tiers' contents past the offer do not matter.
        ``rows_needed`` is left 0: it is read only for a round a refusal cut.
        """
        want_end = -1
        for (_, tpc, _), group_keys in zip(self.groups, keys, strict=False):
            if tpc > 0 and (want_end < 0 or len(group_keys) * tpc < want_end):
                want_end = len(group_keys) * tpc
        if want_end < 0 or offered < want_end - num_computed:
            return None
        self._held_tokens += offered
        self._coverages.append(1.0)
        return Coverage(offered, offered, max(want_end - num_computed, 0), None, False, 0)
