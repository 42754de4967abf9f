"""kvscope's aggregator thread: everything but the recording of raw facts, off vLLM's
scheduler thread.

The scheduler thread appends immutable facts to :attr:`Aggregator.journal`, a flat
list: per event ``handler, k, arg1, ..., argk`` in one ``extend`` (ints, strings, keys,
references to objects vLLM or kvscope no longer changes); nothing else. Flat, because
an event kept as a tuple (or a copied list) is a new object the garbage collector
tracks: kept until the next aggregation (up to ``interval_s``), it outlives the
collections vLLM's own allocations trigger meanwhile, and each such object adds to
generation 0's count (more collections, each scanning it). Appending references to
the journal creates no object; the short-lived tuple an ``extend`` is given is freed
at once. A daemon thread wakes every
``interval_s`` (kvscope's ``flush_interval_s`` setting, default :data:`INTERVAL_S`:
1 s; chosen on the H200, docs/measured-facts.md) and,
holding :attr:`lock`, calls ``refresh``, whose first job is :meth:`drain`: the
events in the order they were recorded (round judging and coverage, request states,
store jobs), then the flush into the recorder, the gauges and vLLM's stats object. A
wake-up that finds no event refreshes the gauges if a reader's drain applied events since
they were last refreshed (:attr:`Aggregator.gauges_due`), else only samples the host's
memory when due (every 5 s: ``host_memory.py``), so that it is watched while the engine
idles too. It is also woken at once when a step's end finds the journal past
:data:`WAKE_ITEMS` (:meth:`Aggregator.behind`), and then only applies the events: a burst
shorter than the interval is applied here as it goes, not all on vLLM's thread at the step
that leaves the engine idle.
On a GPU server that work overlaps the forward pass, where the engine thread waits
with the GIL released.

Synchronous drains, on the caller's thread under the same lock: a reader of the
recorder (a scrape, a test, ``kvscope demo``: ``Recorder.before_read``), a rare
round that must be judged at once (it probes the tiers), an idle engine's step,
shutdown, and a journal past :data:`JOURNAL_LIMIT` (a dead or starved thread:
counted, ``kvscope_telemetry_errors_total{where="aggregator"}``, and the scheduler
thread aggregates itself, so memory stays bounded).

An event is one ``extend`` and ``del journal[:n]`` one C-level list operation (each
atomic under the GIL): the thread takes the first ``n`` items, whole events, while the
scheduler thread keeps appending.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import ErrorSite

logger = logging.getLogger("kvscope")

# The default of kvscope's flush_interval_s setting (settings.Settings), the one place it
# is written: seconds between two aggregations while events arrive (vLLM's stats path lags
# by at most this and one step; a scrape drains at once), and a rank's tally flush cadence.
INTERVAL_S = 1.0
# Journal items (references, 8 bytes each) waiting past which the scheduler thread drains
# itself: 8 MiB. An event holds O(1) items whatever the prefix's length: a round its
# summary (lookup.rounds.summarize), a store job one tuple of its keys, a step its
# scheduled ids (at most max_num_seqs), so only a dead or starved thread gets here.
JOURNAL_LIMIT = 1_000_000
# Journal items waiting past which the scheduler thread wakes this one at once (checked once
# a step: Aggregator.behind): its events are applied then, off vLLM's thread, rather than at
# the next wake-up. Else a burst shorter than ``interval_s`` ends with all of it applied on vLLM's
# thread at the step that leaves the engine idle (``SchedulerObserver.settle``), delaying that
# step's outputs. 2,048 items are some 170 lookup rounds or 8 steps of 256 running requests.
WAKE_ITEMS = 2048
# Events this thread applies between two GIL releases (time.sleep(0)): vLLM's engine
# thread waits at most that long for the GIL, not a whole drain (the interpreter's own
# switch interval is 5 ms).
YIELD_EVERY = 128
# The longest this thread holds its aggregation back while a restore's reads are in flight
# (``busy``): vLLM's fs read threads need the GIL between their system calls, and beside
# vLLM's engine thread re-scanning the waiting request every step they get little of it, so
# every millisecond of GIL this thread takes then is taken from them
# (docs/measured-facts.md). A scrape still drains at once; vLLM's stats path lags by this at most.
MAX_DEFER_S = 10.0


class HoldBack:
    """A periodic thread's work held back while ``busy()`` (vLLM's tier I/O in flight), for
    at most ``max_s`` at a time: under sustained traffic it runs anyway. The aggregator's
    and the tier probe's (tiers/probe.py)."""

    def __init__(self, busy: Callable[[], bool] | None, max_s: float) -> None:
        self.busy = busy  # None: never held back
        self.max_s = max_s
        self.held = 0  # wake-ups held back (tests read it)
        self._since: float | None = None  # when the current hold began

    def hold(self) -> bool:
        """True: skip this wake-up's work. May raise what ``busy`` raises."""
        if self.busy is not None and self.busy():
            now = time.monotonic()
            if self._since is None:
                self._since = now
            if now - self._since < self.max_s:
                self.held += 1
                return True
        self._since = None
        return False


def journal_events(items: list) -> int:
    """How many whole events a flat journal holds (a reader's count: a benchmark, a test);
    ValueError if its last event is cut."""
    i = n = 0
    while i < len(items):
        i += 2 + items[i + 1]
        n += 1
    if i != len(items):
        raise ValueError(f"a journal event runs past its end ({i} > {len(items)})")
    return n


class Aggregator:
    def __init__(self, *, recorder: Recorder, refresh: Callable[[], None],
                 interval_s: float = INTERVAL_S,
                 quiet: Callable[[], None] | None = None) -> None:
        """``quiet``: called on a wake-up that finds no event (the engine idles or waits):
        cheap periodic work that must go on while nothing happens (the host's memory)."""
        self.rec = recorder
        self.journal: list = []  # flat: handler, k, k args; handler, k, ...
        # Held by whoever aggregates (this thread, a synchronous drain): kvscope's
        # aggregate state (rooms, request states, refused stores) is touched only so.
        self.lock = threading.RLock()
        self.interval_s = interval_s
        self.limit = JOURNAL_LIMIT  # and wake_at (the lower of WAKE_ITEMS and it)
        self.cpu_s = 0.0  # this thread's CPU time (time.thread_time), for the benchmark
        self._refresh = refresh
        self._quiet = quiet
        # while vLLM's tier reads are in flight (its busy: TierTaps.reading, set by the owner
        # once its taps exist)
        self.hold_back = HoldBack(None, MAX_DEFER_S)
        # Set by the owner when a reader's drain applied events and left the gauges as they
        # were (a scrape: counters at once, gauges at this cadence), cleared by a refresh.
        # Without it the next wake-up finds the journal empty and the gauges keep what they
        # read before those events for good: an engine that stopped stepping (vLLM holds no
        # request) would read busy until its next request.
        self.gauges_due = False
        # Held but while behind() or close() releases it: the thread waits with one C-level
        # timed acquire (a threading.Event's wait is Python code around it: ~1.5x the CPU
        # per wake-up, 20 wake-ups a second) and is woken at once by either
        self._woken = threading.Lock()
        self._woken.acquire()
        self._nudged = False  # released by behind() and not yet caught up: no second release
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, items: int) -> None:
        """Journal items past which the scheduler thread drains itself (:meth:`behind`);
        :attr:`wake_at`, where it wakes this thread, is never above it."""
        self._limit = items
        self.wake_at = min(WAKE_ITEMS, items)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def start(self) -> Aggregator:
        if self.interval_s > 0 and self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._loop, name="kvscope-aggregator",
                                            daemon=True)
            self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        woken = self._woken.acquire
        # interval_s read at each wake-up: a benchmark may change it while the engine runs
        while True:
            nudged = woken(timeout=self.interval_s)
            if self._closed:
                return
            if nudged:
                self.catch_up()
            else:
                self.wake()
            self.cpu_s = time.thread_time()

    def wake(self) -> None:
        """One wake-up's work: this thread's every ``interval_s`` (a test's, in step with an
        engine). Events waiting, or events a reader's drain applied since the gauges were
        last refreshed (:attr:`gauges_due`): the whole refresh, unless held back; else the
        quiet work."""
        try:
            # sampled at every wake-up, the journal empty or not: one that finds no read
            # in flight ends the hold's period. Left open across an idle engine (its
            # journal drained by a scrape, nothing journaled since), the period ran out
            # at the first wake-up beside the next restore's reads and drained there
            held = self.hold_back.hold()
            if self.journal or self.gauges_due:
                if not held:
                    self._refresh()
            elif self._quiet is not None:
                self._quiet()
        except Exception as exc:  # refresh guards its parts; this is the last line
            self.rec.error(ErrorSite.AGGREGATOR, exc)
        self._nudged = False  # a nudge held back waits for this wake-up to be taken again

    def catch_up(self) -> None:
        """This thread, woken by :meth:`behind`: the journal's events applied now, unless held
        back (vLLM's tier reads in flight: then nudges wait for the next wake-up). Not
        flushed: that stays at ``interval_s`` (each flush has a fixed cost), the next
        wake-up's, which :attr:`gauges_due` makes whole though no event waits then."""
        try:
            if self.hold_back.hold():
                return
            with self.lock:
                self.drain()
                self.gauges_due = True
        except Exception as exc:
            self.rec.error(ErrorSite.AGGREGATOR, exc)
        self._nudged = False

    def behind(self) -> bool:
        """Scheduler thread, once a step whose journal holds over :attr:`wake_at` items.
        True when the caller must drain itself (:meth:`overflowed`); else this thread is
        woken to apply the events now (once until it has)."""
        if self.overflowed():
            return True
        if not self._nudged and self._thread is not None:
            self._nudged = True
            try:
                self._woken.release()
            except RuntimeError:  # released already (close(), a nudge the wake-up overtook)
                pass
        return False

    def drain(self) -> None:
        """Apply the journal's events in order (the caller holds :attr:`lock`)."""
        journal = self.journal
        n = len(journal)
        if not n:
            return
        items = journal[:n]
        del journal[:n]
        own = threading.current_thread() is self._thread
        i = applied = 0
        while i < n:
            try:
                k = items[i + 1]
                j = i + 2 + k
                if j > n:  # a malformed event: the rest cannot be read
                    raise ValueError(f"journal event of {k} args at {i} past its end {n}")
            except Exception as exc:
                self.rec.error(ErrorSite.AGGREGATOR, exc)
                return
            try:
                items[i](*items[i + 2:j])
            except Exception as exc:
                self.rec.error(ErrorSite.AGGREGATOR, exc)
            i = j
            applied += 1
            if own and applied % YIELD_EVERY == 0:
                time.sleep(0)  # the GIL to vLLM's thread, if it waits

    def overflowed(self) -> bool:
        """The journal outgrew :attr:`limit` (:data:`JOURNAL_LIMIT`; thread dead or
        starved): counted; the caller then drains itself."""
        if len(self.journal) <= self.limit:
            return False
        self.rec.error(ErrorSite.AGGREGATOR, RuntimeError(
            f"aggregator behind ({len(self.journal)} journal items waiting; "
            f"thread {'alive' if self.alive() else 'dead'}): the scheduler thread drains"))
        return True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._woken.release()
            except RuntimeError:  # a nudge released it
                pass
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
