"""Where a restore's time goes: the scheduler's deferred rescans, waiting for rows, the
secondary tier's reads, the load to the GPU.

A restore is a request whose lookup round offered tokens: from its first lookup round
(often deferred: a tier's existence check or a promotion still reading, and vLLM asks again
every step, each round looking up the prompt's keys anew) to the step that ran it with the
offered tokens loaded. The scheduler thread stamps each round's start and duration, the
allocation and each step (``time.perf_counter``: two calls per round, one per step); the
split is made here, on the aggregator thread, from the journal, in the order the calls
happened:

* ``deferred_rescans``: the durations of the request's deferred rounds;
* ``waiting_for_rows`` / ``tier_reads``: the time between its rounds not spent in them,
  after a round whose promotion found no free primary row / otherwise;
* ``gpu_load``: from vLLM's allocation for the offered tokens to the step that ran it.

A request that ends before its load (aborted, preempted) is forgotten, not counted.
"""

from __future__ import annotations

from collections.abc import Collection

from kvscope.exporters import signals
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import PREFIX_LENGTH_BOUNDS, PrefixLength, RestorePhase

_PHASES = tuple((signals.RESTORE_PHASE_SECONDS, (p.value,)) for p in RestorePhase)
_RESCANS, _WAIT_ROWS, _READS, _LOAD = range(4)  # indexes of RestorePhase, in order


def prefix_bucket(tokens: int) -> str:
    for bound, bucket in PREFIX_LENGTH_BOUNDS:
        if tokens <= bound:
            return bucket.value
    return PrefixLength.OVER_1M.value


class _Restore:
    __slots__ = ("first", "last_end", "rows", "phases", "rescans", "keys", "tokens",
                 "alloc")

    def __init__(self, started: float) -> None:
        self.first = started
        self.last_end = started
        self.rows = False  # the previous round found no free row for a promotion
        self.phases = [0.0, 0.0, 0.0, 0.0]
        self.rescans = 0
        self.keys = 0
        self.tokens = 0  # offered by the round that ended it (0: still deferred)
        self.alloc = 0.0


class RestoreClock:
    def __init__(self) -> None:
        self._open: dict[str, _Restore] = {}  # looked up, not yet run with its KV
        self._loading: dict[str, _Restore] = {}  # allocated for offered tokens
        self._done: list[_Restore] = []  # since the last flush

    def on_round(self, rid: str, num_tokens: int | None, started: float, took: float,
                 keys: int, rows_short: bool = False) -> None:
        """A lookup round of ``rid`` began at ``started`` and took ``took`` seconds;
        ``num_tokens`` None: deferred; ``keys``: lookups it made; ``rows_short``: a
        promotion of it found no free primary row."""
        if not started:  # a round the scheduler did not time
            return
        r = self._open.get(rid)
        if r is None:
            if not num_tokens and num_tokens is not None:  # a plain miss: nothing to time
                return
            r = self._open[rid] = _Restore(started)
        gap = started - r.last_end
        if gap > 0:
            r.phases[_WAIT_ROWS if r.rows else _READS] += gap
        r.last_end = started + took
        r.rows = rows_short
        if num_tokens is None:
            r.phases[_RESCANS] += took
            r.rescans += 1
            r.keys += keys
        elif num_tokens > 0:
            r.tokens = num_tokens
        else:  # ended with nothing offered: no restore
            del self._open[rid]

    def on_alloc(self, rid: str, num_external_tokens: int, at: float) -> None:
        r = self._open.pop(rid, None)
        if r is None or not num_external_tokens or not at:
            return
        r.alloc = at
        r.tokens = num_external_tokens
        self._loading[rid] = r

    def on_step(self, scheduled: Collection[str], at: float) -> None:
        """A step ran ``scheduled``: a loading request among them has its KV."""
        loading = self._loading
        if not loading or not scheduled or not at:
            return
        for rid in [r for r in scheduled if r in loading]:
            r = loading.pop(rid)
            r.phases[_LOAD] += max(0.0, at - r.alloc)
            self._done.append(r)

    def on_finished(self, rid: str) -> None:
        self._open.pop(rid, None)
        self._loading.pop(rid, None)

    def flush(self, rec: Recorder) -> None:
        done, self._done = self._done, []
        if not done:
            return
        sums = [0.0, 0.0, 0.0, 0.0]
        rescans = keys = 0
        for r in done:
            for i, s in enumerate(r.phases):
                sums[i] += s
            rescans += r.rescans
            keys += r.keys
            rec.observe(signals.RESTORE_DURATION, (prefix_bucket(r.tokens),), sum(r.phases))
        for (metric, labels), s in zip(_PHASES, sums, strict=True):
            rec.inc(metric, labels, s)
        rec.inc(signals.RESTORE_RESCANS, (), rescans)
        rec.inc(signals.RESTORE_RESCAN_KEYS, (), keys)
