"""In-process telemetry state: pending counters, flushed every ``flush_interval_s``
(kvscope's setting, default 1 s) on the scheduler side (``connector/aggregator.py``)
and on a worker rank (``connector/worker/tally.py``); at once for a reader.

The connector calls :meth:`Recorder.inc` / :meth:`Recorder.observe` /
:meth:`Recorder.set` from vLLM's scheduler or worker thread and from kvscope's
aggregator thread (``connector/aggregator.py``): dict operations under one
uncontended lock (several writer threads; per tier job or per flush, never per
key). The connector calls :meth:`flush`, which moves what was recorded into

* the cumulative state a Prometheus scrape reads (:meth:`snapshot`), and
* a delta that vLLM's stats pipeline takes with :meth:`take_delta`.

Telemetry never breaks serving: :meth:`error` counts and logs an exception once
per site; :meth:`guard` wraps a block so that it cannot raise.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial, reduce
from operator import add

from kvscope.exporters import signals
from kvscope.exporters.signals import Kind, Metric

logger = logging.getLogger("kvscope")

Labels = tuple[str, ...]
# Histogram observations kept per series for vLLM's stats path between two takes.
MAX_DELTA_OBSERVATIONS = 10_000
Key = tuple[Metric, Labels]
_ABSENT = object()  # compares unequal to every value


@dataclass
class HistogramState:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)  # last one is +Inf

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_many(self, values) -> None:
        """The first bucket whose upper bound is >= the value (+Inf past the last).
        C-level passes (a flush's batch: an idle engine's last flush runs on vLLM's
        scheduler thread), the sum added in order as one value at a time would be; a NaN
        (its bucket +Inf, where bisect would place it first) takes the loop."""
        if not values:
            return
        total = reduce(add, values, self.total)
        if total != total:  # a NaN among them (or +Inf and -Inf): value by value
            self._observe_each(values)
            return
        counts = self.counts
        for i, n in Counter(map(partial(bisect_left, self.buckets), values)).items():
            counts[i] += n
        self.total = total
        self.count += len(values)

    def _observe_each(self, values) -> None:
        counts, buckets, last = self.counts, self.buckets, len(self.buckets)
        for value in values:
            counts[bisect_left(buckets, value) if value == value else last] += 1  # NaN: +Inf
            self.total += value
        self.count += len(values)


@dataclass
class Delta:
    """What changed since the previous :meth:`Recorder.take_delta`."""

    counters: dict[Key, float]
    gauges: dict[Key, float]
    observations: dict[Key, list[float]]

    def is_empty(self) -> bool:
        return not (self.counters or self.gauges or self.observations)


@dataclass
class Snapshot:
    counters: dict[Key, float]
    gauges: dict[Key, float]
    histograms: dict[Key, HistogramState]


class Recorder:
    """Counters, gauges and histograms keyed by (signal, label values)."""

    def __init__(self, *, keep_delta: bool = True) -> None:
        self._lock = threading.Lock()  # the flushed state (scrapes, vLLM's stats path)
        self._wlock = threading.Lock()  # the pending state (several writer threads)
        # Called before a read of the flushed state (snapshot, value): the scheduler
        # side's synchronous drain of its aggregator, so a reader sees every event
        # recorded before it read. None: nothing to drain (worker side).
        self.before_read = None
        self._keep_delta = keep_delta
        # pending state (several writer threads, under _wlock): moved out by flush()
        self._pending_counts: dict[Key, float] = defaultdict(float)
        self._pending_obs: dict[Key, list[float]] = defaultdict(list)
        self._gauges: dict[Key, float] = {}
        self._dirty_gauges: set[Key] = set()
        # flushed
        self._counters: dict[Key, float] = {}
        self._histograms: dict[Key, HistogramState] = {}
        self._delta_counts: dict[Key, float] = defaultdict(float)
        self._delta_obs: dict[Key, list[float]] = defaultdict(list)
        self._delta_gauges: dict[Key, float] = {}
        # flush() put something into the delta since the last take_delta(): lets the
        # per-step stats hook return without a lock when nothing was flushed
        self.delta_ready = False
        self._errors_logged: set[str] = set()
        self._guards: dict[signals.ErrorSite, _Guard] = {}

    # ---- writers (scheduler, worker or aggregator thread) ----------------
    def inc(self, metric: Metric, labels: Labels = (), value: float = 1.0) -> None:
        with self._wlock:
            self._pending_counts[(metric, labels)] += value

    def declare(self, metric: Metric, *label_sets: Labels) -> None:
        """Make counter series exist at 0 before their first event (no "No data" panels)."""
        with self._wlock:
            for labels in label_sets or ((),):
                self._pending_counts[(metric, labels)] += 0.0

    def observe(self, metric: Metric, labels: Labels, value: float) -> None:
        with self._wlock:
            self._pending_obs[(metric, labels)].append(value)

    def observe_many(self, metric: Metric, labels: Labels, values: list[float]) -> None:
        """Several observations at once (a room's per-flush batch)."""
        with self._wlock:
            self._pending_obs[(metric, labels)].extend(values)

    def set(self, metric: Metric, labels: Labels, value: float) -> None:
        key = (metric, labels)
        with self._wlock:
            if self._gauges.get(key) != value or key not in self._gauges:
                self._gauges[key] = value
                self._dirty_gauges.add(key)  # only changes travel through vLLM's stats path

    def set_many(self, items: list[tuple[Key, float]]) -> None:
        """Several gauges at once, ``((metric, labels), value)`` each: one lock for a
        snapshot's gauges (the scheduler side's, every flush); as :meth:`set` each."""
        with self._wlock:
            gauges, dirty = self._gauges, self._dirty_gauges  # flush() swaps the set
            for key, value in items:
                if gauges.get(key, _ABSENT) != value:  # absent, changed (or NaN)
                    gauges[key] = value
                    dirty.add(key)

    def replace_gauge(self, metric: Metric, values: dict[Labels, float]) -> None:
        """Set every series of ``metric`` at once; series not named are dropped."""
        with self._wlock:
            for key in [k for k in self._gauges if k[0] is metric and k[1] not in values]:
                del self._gauges[key]
        for labels, value in values.items():
            self.set(metric, labels, value)

    def error(self, where: signals.ErrorSite, exc: BaseException) -> None:
        """Count a swallowed exception; log it the first time per site."""
        try:
            with self._wlock:
                self._pending_counts[(signals.TELEMETRY_ERRORS, (where.value,))] += 1
            if where.value not in self._errors_logged:
                self._errors_logged.add(where.value)
                logger.warning(
                    "kvscope telemetry error in %s (serving continues; further errors "
                    "here are only counted in %s): %r",
                    where.value, signals.TELEMETRY_ERRORS.name, exc, exc_info=exc,
                )
        except Exception:  # pragma: no cover - last line of defence
            pass

    def guard(self, where: signals.ErrorSite) -> _Guard:
        """``with rec.guard(site):`` - an exception inside is counted, not raised."""
        g = self._guards.get(where)
        if g is None:
            g = self._guards[where] = _Guard(self, where)
        return g

    # ---- every flush_interval_s or a synchronous drain (scheduler: aggregator.py; worker: worker/tally.py)
    def flush(self) -> None:
        with self._wlock:
            counts, self._pending_counts = self._pending_counts, defaultdict(float)
            obs, self._pending_obs = self._pending_obs, defaultdict(list)
            dirty, self._dirty_gauges = self._dirty_gauges, set()
            gauges = {key: self._gauges[key] for key in dirty if key in self._gauges}
        if self._keep_delta and (counts or obs or dirty):
            self.delta_ready = True
        with self._lock:
            for key, value in counts.items():
                self._counters[key] = self._counters.get(key, 0.0) + value
                if self._keep_delta:
                    self._delta_counts[key] += value
            for key, values in obs.items():
                state = self._histograms.get(key)
                if state is None:
                    state = self._histograms[key] = HistogramState(key[0].buckets or ())
                state.observe_many(values)
                if self._keep_delta:
                    pending = self._delta_obs[key]
                    # Bounded: nobody may take the delta (vLLM stats off); the
                    # cumulative histogram above stays exact regardless.
                    pending.extend(values[: max(MAX_DELTA_OBSERVATIONS - len(pending), 0)])
            if self._keep_delta:
                self._delta_gauges.update(gauges)

    # ---- from another thread (a probe off the scheduler thread) --------------
    # The methods above write under _wlock: counters and histograms reach a scrape, and
    # every change vLLM's delta, only at the next flush(). These apply straight to the
    # flushed state and the delta under _lock, as flush() does, so a scrape sees them at
    # once. The series should be declared (or set) first on the owning thread so that
    # no new gauge key appears under a hot-path iteration.
    def inc_threadsafe(self, metric: Metric, labels: Labels = (), value: float = 1.0) -> None:
        key = (metric, labels)
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + value
            if self._keep_delta:
                self._delta_counts[key] += value

    def set_threadsafe(self, metric: Metric, labels: Labels, value: float) -> None:
        key = (metric, labels)
        with self._lock:
            self._gauges[key] = value
            if self._keep_delta:
                self._delta_gauges[key] = value

    def take_delta(self) -> Delta:
        self.delta_ready = False
        with self._lock:
            delta = Delta(dict(self._delta_counts), dict(self._delta_gauges),
                          {k: list(v) for k, v in self._delta_obs.items()})
            self._delta_counts.clear()
            self._delta_gauges.clear()
            self._delta_obs.clear()
        return delta

    def snapshot(self) -> Snapshot:
        if self.before_read is not None:
            self.before_read()
        with self._lock:
            return Snapshot(
                dict(self._counters),
                dict(self._gauges),
                {k: HistogramState(v.buckets, list(v.counts), v.total, v.count)
                 for k, v in self._histograms.items()},
            )

    # ---- reading (tests, demo) -----------------------------------------
    def value(self, metric: Metric, labels: Labels = ()) -> float:
        """Flushed value of one series (0 when never recorded)."""
        if self.before_read is not None:
            self.before_read()
        with self._lock:
            if metric.kind is Kind.COUNTER:
                return self._counters.get((metric, labels), 0.0)
            if metric.kind is Kind.GAUGE:
                return self._gauges.get((metric, labels), 0.0)
            state = self._histograms.get((metric, labels))
            return float(state.count) if state else 0.0


class _Guard:
    """A reusable, allocation-free context manager (hot paths enter it per event)."""

    __slots__ = ("_rec", "_where")

    def __init__(self, rec: Recorder, where: signals.ErrorSite) -> None:
        self._rec = rec
        self._where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and issubclass(exc_type, Exception):
            self._rec.error(self._where, exc)  # telemetry must never raise into vLLM
            return True
        return False
