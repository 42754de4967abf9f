"""Lookup rounds: what vLLM's manager answered per key, judged once per round.

The hot path fills two slots, keys and results: once per key looked up, two list
appends made by the manager proxy, or, where vLLM's prefix scan tells a round's
lookups (prefix_scan.py), two list extends per scan. No hashing, no labels, no
recorder calls, nothing that grows with the number of requests. When a plain round (one
``get_num_new_matched_tokens`` call, no rare event) ends, its lookups are summarized at
once on the scheduler thread in C-level passes over the two lists (``list.count``,
``list.index``; no Python frame per key): with one KV group into counts per result, keys
consumed and the first MISS's key (``LookupLog.counted``'s shape), from which the
aggregator thread judges it (round_verdicts.RoundVerdicts.judge_counted:
:meth:`LookupCounts.add_counted`, and :func:`summarize_counted` where judging needs the
round's facts); with several into what judging reads (:func:`summarize`: the counts
per group and result, and a :class:`RoundFacts`: how many keys, misses and pending keys,
where each group's scan stopped). The slots are emptied: the journal carries
O(groups) objects per round, never the lookups, so its size and the aggregator thread's
work (aggregator.py) are bounded per round whatever the prefix's length (a 131k-token
prompt is ~8,200 keys, looked up again on every step its restore is deferred). Rounds with
a rare event (a quarantined key, a refused promotion, an eviction) are judged as they end
from the whole :class:`Round`, in time linear in its lookups.
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Any

from kvscope.connector import compat
from kvscope.connector.lookup.coverage import MissCause
from kvscope.connector.lookup.evictions import Evictions
from kvscope.exporters import signals
from kvscope.exporters.signals import Verdict

_SUFFIX = operator.itemgetter(slice(-compat.GROUP_SUFFIX_BYTES, None))
_MISS, _HIT = compat.MISS, compat.HIT
_RETRY, _HIT_PENDING = compat.RETRY, compat.HIT_PENDING
# Label values keyed by id(): vLLM's LookupResult is an Enum, whose hash is Python code.
_RESULT_VALUE = {id(v): s.value for v, s in compat.LOOKUP_RESULT.items()}
_RESULTS = tuple(signals.LookupResult)
_NONE: tuple = ()  # a plain round has no rare events
_ABSENT = MissCause.ABSENT
# (verdict, label tuple): no Enum hash or .value (Python code in 3.11) per round
_HIT_V, _MISS_V, _VETOED, _DEFERRED = ((v, (v.value,)) for v in (
    Verdict.HIT, Verdict.MISS, Verdict.VETOED, Verdict.DEFERRED))


class LookupLog:
    """Slots for raw lookup events since the last round ended, and the open round's
    place in them (scheduler thread only). The rare events' lists hold only the open
    round's (emptied when a round begins and ends)."""

    __slots__ = ("keys", "results", "quarantined", "refusals", "evictions", "start",
                 "_started_ns", "compact", "counted")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.results: list[Any] = []
        self.quarantined: list[int] = []  # indexes kvscope answered MISS itself
        self.refusals: list[tuple[int, int]] = []  # (index of the lookup in progress, keys)
        # (index of the lookup in progress, keys a started promotion evicted), kept flat
        self.evictions = Evictions()
        self.start = -1  # index where the open round began; -1: no round open
        self._started_ns = 0
        # True while a plain round's call runs (scheduler/hooks.py): a deferred scan may then
        # leave its lookups counted (``counted``: HIT, HIT_PENDING, RETRY, MISS counts, the
        # keys consumed, the last key), not written key by key (prefix_scan.py)
        self.compact = False
        self.counted: tuple | None = None

    # ---- rare paths (called by the proxy / the primary-tier tap) --------------------
    def add_quarantined(self, key: bytes) -> None:
        self.quarantined.append(len(self.results))
        self.keys.append(key)
        self.results.append(_MISS)

    def add_refusal(self, n_keys: int) -> None:
        """A promotion found no primary row during the lookup in progress."""
        self.refusals.append((len(self.results), n_keys))

    def add_evictions(self, keys: Any) -> None:
        """A promotion started during the open round evicted these keys' rows."""
        if self.start >= 0:
            self.evictions.add(len(self.results), keys)

    # ---- rounds -----------------------------------------------------------------------
    def begin(self, started_ns: int = 0) -> None:
        """``started_ns``: wall-clock start for the round's span (0 when not tracing)."""
        self._started_ns = started_ns
        self.start = len(self.results)
        if self.quarantined or self.refusals or self.evictions:  # from outside a round
            self.quarantined.clear()
            self.refusals.clear()
            self.evictions.clear()

    def end(self) -> tuple[Round | None, list[bytes], list[Any]]:
        """End the open round (any kind): the round decoded, and copies of the lookups
        since the last hand-over (to count); the slots are emptied."""
        start, self.start = self.start, -1
        rnd = None
        if start >= 0:
            rnd = Round(self, start, self.quarantined, self.refusals, self.evictions,
                        self._started_ns)
        keys, results = self.keys[:], self.results[:]
        self.keys.clear()
        self.results.clear()
        self.quarantined.clear()
        self.refusals.clear()
        self.evictions.clear()
        return rnd, keys, results


class LookupCounts:
    """``kvscope_lookups_total`` per (group, result): each round's counts taken on the
    scheduler thread (:meth:`tally`, C-level passes), summed on the aggregator thread
    (:meth:`add`), into the recorder at each flush."""

    def __init__(self, only_suffix: bytes | None = None) -> None:
        """``only_suffix``: the key suffix of the only KV group (None: several)."""
        self.only_suffix = only_suffix
        self.counts: Counter = Counter()
        self._labels: dict[tuple[bytes, int], tuple[str, str]] = {}
        only = only_suffix
        self._single = None if only is None else tuple(
            ((only, id(v)), v) for v in (_HIT, _MISS, _RETRY, _HIT_PENDING))
        # in LookupLog.counted's order
        self._counted_pairs = None if only is None else tuple(
            (only, id(v)) for v in (_HIT, _HIT_PENDING, _RETRY, _MISS))

    def tally(self, keys: list[bytes], results: list[Any]) -> dict[tuple[bytes, int], int]:
        """(group suffix, id of the result) -> lookups, of these lookups. One KV group:
        one ``list.count`` per result value (every key carries its suffix); several: the
        suffix of each key, counted in C (``Counter`` over ``zip``/``map``)."""
        single = self._single
        if single is not None:  # a loop, not a comprehension: no frame per round
            count, out = results.count, {}
            for pair, v in single:
                if n := count(v):
                    out[pair] = n
            return out
        return Counter(zip(map(_SUFFIX, keys), map(id, results)))

    def add_counted(self, counted: tuple) -> None:
        """Aggregator: :meth:`add` of a round handed over counted (``LookupLog.counted``'s
        shape: one KV group), no dict between."""
        own = self.counts
        for pair, n in zip(self._counted_pairs, counted):
            if n:
                own[pair] += n

    def add(self, counts: dict[tuple[bytes, int], int]) -> None:
        """Aggregator: one round's :meth:`tally`."""
        own = self.counts
        for pair, n in counts.items():
            own[pair] += n

    def flush(self, rec: Any) -> None:
        labels = self._labels
        for pair, n in self.counts.items():
            lv = labels.get(pair)
            if lv is None:
                lv = labels[pair] = (str(int.from_bytes(pair[0], "big")),
                                     _RESULT_VALUE[pair[1]])
            rec.inc(signals.LOOKUPS, lv, n)
        self.counts.clear()


def summarize(keys: list[bytes], results: list[Any], start: int,
              several_groups: bool) -> RoundFacts:
    """What judging a plain round reads, from its lookups ``[start:]`` of the slots
    (scheduler thread, as the round ends): C-level passes, no frame per key."""
    if start:
        keys, results = keys[start:], results[start:]
    facts = RoundFacts()
    facts.n = len(results)
    count = results.count
    facts.misses = misses = count(_MISS)
    facts.pending_keys = count(_RETRY) + count(_HIT_PENDING)
    if not misses:
        facts.miss_key = None
        facts.group_misses = {}
        return facts
    i = results.index(_MISS)
    facts.miss_key = keys[i]
    if not several_groups:
        facts.group_misses = {keys[i][-compat.GROUP_SUFFIX_BYTES:]: (keys[i], _ABSENT)}
        return facts
    out: dict[bytes, tuple[bytes, MissCause]] = {}
    i = -1
    for _ in range(misses):  # each group's first MISS (misses are few: a scan stops there)
        i = results.index(_MISS, i + 1)
        key = keys[i]
        out.setdefault(key[-compat.GROUP_SUFFIX_BYTES:], (key, _ABSENT))
    facts.group_misses = out
    return facts


def summarize_counted(counted: tuple) -> RoundFacts:
    """:func:`summarize` of a round whose one scan was left counted (``LookupLog.counted``:
    HIT, HIT_PENDING, RETRY, MISS, keys consumed, the last key; a MISS is the last key)."""
    facts = RoundFacts()
    _, pending, retry, misses, facts.n, last = counted
    facts.misses, facts.pending_keys = misses, pending + retry
    if misses:
        facts.miss_key = last
        facts.group_misses = {last[-compat.GROUP_SUFFIX_BYTES:]: (last, _ABSENT)}
    else:
        facts.miss_key = None
        facts.group_misses = {}
    return facts


class RoundFacts:
    """A plain round, summarized (:func:`summarize`): what :class:`Round` tells judging,
    without its lookups. No rare event: no refusal, eviction or quarantined key."""

    __slots__ = ("n", "misses", "pending_keys", "miss_key", "group_misses")
    refusals = quarantined = evictions = _NONE
    no_row = 0

    def verdict(self, num_tokens: int | None) -> tuple[Verdict, tuple[str]]:
        if num_tokens is None:
            return _DEFERRED
        if num_tokens > 0:
            return _HIT_V
        return _VETOED if self.n - self.misses else _MISS_V

    def at_row_ceiling(self, rows_total: int) -> bool:
        return False  # neither tell (Round.at_row_ceiling): no refusal, no eviction

    def first_miss_key(self) -> bytes | None:
        return self.miss_key

    def first_miss(self) -> dict[bytes, tuple[bytes, MissCause]]:
        return self.group_misses


class Round:
    """One ended round, decoded from its slice of the log (once per round)."""

    __slots__ = ("keys", "results", "quarantined", "refusals", "evictions", "started_ns")

    def __init__(self, log: LookupLog, start: int, quarantined: list[int],
                 refusals: list[tuple[int, int]], evictions: Evictions,
                 started_ns: int = 0) -> None:
        self.started_ns = started_ns
        self.evictions = evictions.shifted(-start)
        self.results = log.results[start:]
        self.keys = log.keys[start:]
        self.quarantined = [i - start for i in quarantined]
        self.refusals = [(i - start, n) for i, n in refusals]

    @classmethod
    def plain(cls, keys: list[bytes], results: list[Any], start: int) -> Round:
        """A round without rare events (no quarantined key, refused promotion or eviction),
        whole: ``[start:]`` of the lookups handed over. The hook judges such rounds from
        :func:`summarize` instead; this is the reference the tests hold the summary to."""
        rnd = cls.__new__(cls)
        rnd.started_ns = 0
        rnd.results = results[start:] if start else results
        rnd.keys = keys[start:] if start else keys
        rnd.quarantined = rnd.refusals = rnd.evictions = _NONE
        return rnd

    @property
    def no_row(self) -> int:
        """Keys whose promotion was refused this round: the primary tier was full."""
        return sum(n for _, n in self.refusals)

    def found(self, end: int | None = None) -> set[bytes]:
        """Keys some tier holds (looked up, not answered MISS), among the first ``end``."""
        keys, results = self.keys, self.results
        n = len(results) if end is None else end
        return {keys[i] for i in range(n) if results[i] is not _MISS}

    def first_miss_key(self) -> bytes | None:
        """The round's first key answered MISS (None: no MISS)."""
        results = self.results
        return self.keys[results.index(_MISS)] if _MISS in results else None

    def at_row_ceiling(self, rows_total: int) -> bool:
        """The keys this round found reached the row count and its promotions ran
        out of rows: refused for want of a free row (0.26, ``no_row``) or evicting
        rows the round itself found (0.33: lookups no longer touch rows, so a full
        tier evicts instead of refusing). Async-lookup RETRYs alone can also reach
        the row count (a working set exactly the tier's size)."""
        if not (self.refusals or self.evictions):  # neither tell (every plain round)
            return False
        results = self.results
        # lookups found bound the distinct keys found: most rounds stop here, in C
        if rows_total <= 0 or len(results) - results.count(_MISS) < rows_total:
            return False
        if len(self.found()) < rows_total:
            return False
        return self.no_row > 0 or self.self_evicted() > 0

    def self_evicted(self) -> int:
        """Rows this round found that its own promotions evicted again: one pass over
        the lookups, the keys found so far grown as the evictions' places are reached
        (they were recorded in lookup order), so linear in lookups and evicted keys."""
        keys, results = self.keys, self.results
        found: set[bytes] = set()
        done = total = 0
        for i, evicted in self.evictions:
            if i > done:
                found.update(k for k, r in zip(keys[done:i], results[done:i])
                             if r is not _MISS)
                done = i
            total += sum(k in found for k in evicted)
        return total

    @property
    def pending_keys(self) -> int:
        r = self.results
        return r.count(_RETRY) + r.count(_HIT_PENDING)

    def verdict(self, num_tokens: int | None) -> tuple[Verdict, tuple[str]]:
        """(verdict, its label tuple)."""
        if num_tokens is None:
            return _DEFERRED
        if num_tokens > 0:
            return _HIT_V
        found = len(self.results) - self.results.count(_MISS)
        return _VETOED if found else _MISS_V

    def scanned(self) -> set[bytes]:
        """Group suffixes looked up this round."""
        return set(map(_SUFFIX, self.keys))

    def first_miss(self) -> dict[bytes, tuple[bytes, MissCause]]:
        """Group suffix -> (first key answered MISS, why): where each group's scan stopped.

        A miss is REFUSED when a promotion was refused since the previous miss of
        the round (the refusal happens inside the lookup that then answers MISS).
        """
        results = self.results
        n = results.count(_MISS)  # identity compares in C; no exception at the end
        if not n:
            return {}
        keys, quarantined, refusals = self.keys, self.quarantined, self.refusals
        out: dict[bytes, tuple[bytes, MissCause]] = {}
        prev = i = -1
        for _ in range(n):
            i = results.index(_MISS, i + 1)
            if quarantined and i in quarantined:
                cause = MissCause.QUARANTINED
            elif refusals and any(prev < r <= i for r, _ in refusals):
                cause = MissCause.REFUSED
            else:
                cause = MissCause.ABSENT
            prev = i
            key = keys[i]
            suffix = key[-compat.GROUP_SUFFIX_BYTES:]
            if suffix not in out:
                out[suffix] = (key, cause)
        return out

    def per_group(self) -> dict[int, list[int]]:
        """Group -> counts ordered as signals.LookupResult (spans only)."""
        order = {v: i for i, v in enumerate(r.value for r in _RESULTS)}
        out: dict[int, list[int]] = {}
        for (suffix, rid), n in Counter(zip(map(_SUFFIX, self.keys),
                                            map(id, self.results))).items():
            counts = out.setdefault(int.from_bytes(suffix, "big"), [0] * len(_RESULTS))
            counts[order[_RESULT_VALUE[rid]]] += n
        return out
