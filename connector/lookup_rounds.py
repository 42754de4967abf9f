"""Lookup rounds: what vLLM's manager answered per key, judged once per round.

The hot path fills two slots, keys and results: once per key looked up, two list
appends made by the manager proxy, or, where vLLM's prefix scan tells a round's
lookups (prefix_scan.py), two list extends per scan. No hashing, no labels, no
recorder calls, nothing that grows with the number of requests. When a round (one
``get_num_new_matched_tokens`` call) ends, the lookups since the last round are copied
out and the slots emptied; the aggregator thread (aggregator.py) decodes its verdict,
pending keys and where each group's scan stopped (round_verdicts) and sums the
per-group ``kvscope_lookups_total`` counts (:class:`LookupCounts`).
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Any

from kvscope.connector import compat
from kvscope.connector.coverage import MissCause
from kvscope.exporters import signals
from kvscope.exporters.signals import Verdict

_SUFFIX = operator.itemgetter(slice(-compat.GROUP_SUFFIX_BYTES, None))
_MISS, _HIT = compat.MISS, compat.HIT
_RETRY, _HIT_PENDING = compat.RETRY, compat.HIT_PENDING
# Label values keyed by id(): vLLM's LookupResult is an Enum, whose hash is Python code.
_RESULT_VALUE = {id(v): s.value for v, s in compat.LOOKUP_RESULT.items()}
_RESULTS = tuple(signals.LookupResult)
_NONE: tuple = ()  # a plain round has no rare events
# (verdict, label tuple): no Enum hash or .value (Python code in 3.11) per round
_HIT_V, _MISS_V, _VETOED, _DEFERRED = ((v, (v.value,)) for v in (
    Verdict.HIT, Verdict.MISS, Verdict.VETOED, Verdict.DEFERRED))


class LookupLog:
    """Slots for raw lookup events since the last round ended, and the open round's
    place in them (scheduler thread only). The rare events' lists hold only the open
    round's (emptied when a round begins and ends)."""

    __slots__ = ("keys", "results", "quarantined", "refusals", "evictions", "start",
                 "_started_ns")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.results: list[Any] = []
        self.quarantined: list[int] = []  # indexes kvscope answered MISS itself
        self.refusals: list[tuple[int, int]] = []  # (index of the lookup in progress, keys)
        # (index of the lookup in progress, keys a started promotion evicted)
        self.evictions: list[tuple[int, Any]] = []
        self.start = -1  # index where the open round began; -1: no round open
        self._started_ns = 0

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
            self.evictions.append((len(self.results), keys))

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
    """``kvscope_lookups_total`` per (group, result), summed on the aggregator thread
    from the lookups each round handed over, into the recorder at each flush."""

    def __init__(self, only_suffix: bytes | None = None) -> None:
        """``only_suffix``: the key suffix of the only KV group (None: several)."""
        self.only_suffix = only_suffix
        self.counts: Counter = Counter()
        self._labels: dict[tuple[bytes, int], tuple[str, str]] = {}
        # the lookups since the last flush, counted in one C-level pass at the flush: per
        # round one list extend (its lists are in cache now; 50 ms later they are not)
        self._keys: list[bytes] = []
        self._results: list[Any] = []

    def add(self, keys: list[bytes], results: list[Any]) -> None:
        self._results += results
        if self.only_suffix is None:  # several KV groups: the key's suffix names it
            self._keys += keys

    def _count(self) -> None:
        results, self._results = self._results, []
        only = self.only_suffix
        if only is not None:  # one KV group: every key carries its suffix
            counts = self.counts
            for result_id, n in Counter(map(id, results)).items():
                counts[only, result_id] += n
        else:
            keys, self._keys = self._keys, []
            self.counts.update(zip(map(_SUFFIX, keys), map(id, results)))

    def flush(self, rec: Any) -> None:
        if self._results:
            self._count()
        labels = self._labels
        for pair, n in self.counts.items():
            lv = labels.get(pair)
            if lv is None:
                lv = labels[pair] = (str(int.from_bytes(pair[0], "big")),
                                     _RESULT_VALUE[pair[1]])
            rec.inc(signals.LOOKUPS, lv, n)
        self.counts.clear()


class Round:
    """One ended round, decoded from its slice of the log (once per round)."""

    __slots__ = ("keys", "results", "quarantined", "refusals", "evictions", "started_ns")

    def __init__(self, log: LookupLog, start: int, quarantined: list[int],
                 refusals: list[tuple[int, int]], evictions: list[tuple[int, Any]],
                 started_ns: int = 0) -> None:
        self.started_ns = started_ns
        self.evictions = [(i - start, keys) for i, keys in evictions]
        self.results = log.results[start:]
        self.keys = log.keys[start:]
        self.quarantined = [i - start for i in quarantined]
        self.refusals = [(i - start, n) for i, n in refusals]

    @classmethod
    def plain(cls, keys: list[bytes], results: list[Any], start: int) -> Round:
        """A round without rare events (no quarantined key, refused promotion or eviction:
        the connector's hook hands its lookups over, scheduler_hooks.py): ``[start:]`` of
        the lookups handed over."""
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

    def at_row_ceiling(self, rows_total: int) -> bool:
        """The keys this round found reached the row count and its promotions ran
        out of rows: refused for want of a free row (0.26, ``no_row``) or evicting
        rows the round itself found (0.33: lookups no longer touch rows, so a full
        tier evicts instead of refusing). Async-lookup RETRYs alone can also reach
        the row count (a working set exactly the tier's size)."""
        if not (self.refusals or self.evictions):  # neither tell (every plain round)
            return False
        if rows_total <= 0 or len(self.found()) < rows_total:
            return False
        return self.no_row > 0 or self.self_evicted() > 0

    def self_evicted(self) -> int:
        """Rows this round found that its own promotions evicted again."""
        return sum(sum(k in found for k in keys) for i, keys in self.evictions
                   for found in (self.found(i),))

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
