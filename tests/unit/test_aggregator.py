"""kvscope's aggregator thread (connector/aggregator.py) on its own: events applied in the
order they were recorded, on its thread; a failing event counted and the rest applied;
a journal past its wake bound applied by the thread at once, not at its next wake-up;
a journal past its limit reported (and counted) so the caller drains itself."""

from __future__ import annotations

import threading
import time

import pytest

from kvscope.connector.aggregator import Aggregator, journal_events
from kvscope.exporters import signals as S
from kvscope.exporters.recorder import Recorder

_AGGREGATOR = (S.ErrorSite.AGGREGATOR.value,)


def wait_until(predicate, timeout: float = 10.0) -> bool:
    """Poll (no vLLM here: kvscope.sim.scenarios has the same helper)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _aggregator(rec: Recorder, interval_s: float = 0.01) -> Aggregator:
    def refresh() -> None:
        with agg.lock:
            agg.drain()

    agg = Aggregator(recorder=rec, refresh=refresh, interval_s=interval_s)
    return agg


def test_events_are_applied_in_order_on_its_thread_and_a_failing_one_is_counted():
    rec = Recorder()
    agg = _aggregator(rec)
    seen: list[tuple[int, str]] = []

    def note(i: int) -> None:
        seen.append((i, threading.current_thread().name))

    def boom() -> None:
        raise RuntimeError("a broken event")

    agg.journal.extend([note, 1, 1, boom, 0, note, 1, 2])
    agg.start()
    try:
        assert wait_until(lambda: len(seen) == 2)
        agg.journal.extend((note, 1, 3))
        assert wait_until(lambda: len(seen) == 3)
    finally:
        agg.close()
    assert [i for i, _ in seen] == [1, 2, 3]
    assert {name for _, name in seen} == {"kvscope-aggregator"}
    rec.flush()
    assert rec.value(S.TELEMETRY_ERRORS, _AGGREGATOR) == 1
    assert not agg.alive() and not agg.journal


def test_a_journal_past_its_wake_bound_is_applied_at_once_by_the_thread():
    """The scheduler thread's nudge (Aggregator.behind, once a step past ``wake_at``) wakes
    the thread, asleep for an hour here, which applies the events (not flushed: the
    next wake-up's, ``gauges_due``). One nudge until the thread has caught up."""
    rec = Recorder()
    refreshed = [0]

    def refresh() -> None:
        refreshed[0] += 1

    agg = Aggregator(recorder=rec, refresh=refresh, interval_s=3600.0)
    agg.limit = 1_000
    assert agg.wake_at == 1_000  # never above the limit
    agg.limit = 1_000_000
    seen: list[str] = []
    agg.start()
    try:
        agg.journal.extend([seen.append, 1, "past"] * (agg.wake_at // 3 + 1))
        assert not agg.behind()  # the thread is woken; the caller does not drain
        assert not agg.behind()  # a second nudge before it caught up: nothing more
        assert wait_until(lambda: not agg.journal)
        assert len(seen) == agg.wake_at // 3 + 1
        assert agg.gauges_due and refreshed[0] == 0  # applied, the flush left to a wake-up
        agg.journal.extend([seen.append, 1, "again"] * (agg.wake_at // 3))
        assert not agg.behind()  # caught up once: the next nudge wakes it again
        assert wait_until(lambda: not agg.journal)
    finally:
        agg.close()
    assert not agg.alive()
    rec.flush()
    assert rec.value(S.TELEMETRY_ERRORS, _AGGREGATOR) == 0


def test_a_nudge_is_held_back_while_tier_reads_are_in_flight():
    """vLLM's fs read threads need the GIL between their system calls: a nudge beside them
    applies nothing (the periodic wake-up, after max_defer_s at most, does)."""
    rec = Recorder()
    agg = Aggregator(recorder=rec, refresh=lambda: None, interval_s=3600.0)
    reading = [True]
    agg.hold_back.busy = lambda: reading[0]
    agg.start()
    try:
        agg.journal.extend([len, 1, ()] * (agg.wake_at // 3 + 1))
        held = agg.hold_back.held
        assert not agg.behind()
        assert wait_until(lambda: agg.hold_back.held > held)
        assert len(agg.journal) > agg.wake_at  # held back: nothing applied
        assert not agg.behind()  # and no wake-up per step while held: one nudge waits
        time.sleep(0.05)
        assert agg.hold_back.held == held + 1
    finally:
        agg.close()


def test_a_journal_past_its_limit_is_reported_and_counted():
    rec = Recorder()
    agg = _aggregator(rec)  # never started: a dead thread
    agg.limit = 6  # items
    agg.journal.extend([len, 1, (), len, 1, ()])
    assert not agg.overflowed()
    agg.journal.extend((len, 1, ()))
    assert agg.overflowed()
    rec.flush()
    assert rec.value(S.TELEMETRY_ERRORS, _AGGREGATOR) == 1
    with agg.lock:
        agg.drain()  # what the scheduler thread then does
    assert not agg.journal


def test_a_malformed_event_is_counted_and_the_rest_of_its_batch_dropped():
    """An event whose count runs past the journal's end (a kvscope bug) cannot be read,
    nor can anything after it: the events before it are applied, the error is counted."""
    rec = Recorder()
    agg = _aggregator(rec)  # never started: drained here
    seen: list[int] = []
    agg.journal.extend([seen.append, 1, 1, seen.append, 5, 2])
    assert journal_events(agg.journal[:3]) == 1
    with pytest.raises(ValueError):  # what a reader counting the events is told
        journal_events(agg.journal)
    with agg.lock:
        agg.drain()
    assert seen == [1] and not agg.journal
    rec.flush()
    assert rec.value(S.TELEMETRY_ERRORS, _AGGREGATOR) == 1
    agg.journal.extend((seen.append, 1, 3))  # the journal goes on
    with agg.lock:
        agg.drain()
    assert seen == [1, 3]


def test_a_restore_after_an_idle_engine_is_held_back_anew():
    """A restore's reads held the aggregator back; then its journal was drained by someone
    else (a scrape) and the engine idled past max_defer_s with nothing journaled. The next
    restore's reads must be held back again from their start: a hold period left open
    across the idle engine ran out at the first wake-up beside the new reads, and drained
    the journal there (in the A/B benchmark: the first on iteration after an off one)."""
    rec = Recorder()
    drains = [0]

    def refresh() -> None:
        drains[0] += 1
        with agg.lock:
            agg.drain()

    agg = Aggregator(recorder=rec, refresh=refresh, interval_s=0.01)
    reading = [True]
    agg.hold_back.busy = lambda: reading[0]
    agg.hold_back.max_s = 0.5
    agg.journal.extend((len, 1, ()))  # a step of the first restore
    agg.start()
    try:
        held = agg.hold_back.held
        assert wait_until(lambda: agg.hold_back.held >= held + 5)  # the first reads: held
        assert drains[0] == 0
        reading[0] = False
        with agg.lock:  # a scrape drains the journal before the thread's next wake-up
            agg.drain()
        time.sleep(0.7)  # the engine idles past max_defer_s, nothing journaled
        reading[0] = True  # the next restore reads, its steps journaled
        agg.journal.extend((len, 1, ()))
        held = agg.hold_back.held
        assert wait_until(lambda: agg.hold_back.held >= held + 10)  # ~0.1 s of wake-ups
        assert drains[0] == 0 and agg.journal  # held back beside the reads, none drained
        reading[0] = False
        assert wait_until(lambda: drains[0] == 1 and not agg.journal)  # drained after
    finally:
        agg.close()
    rec.flush()
    assert rec.value(S.TELEMETRY_ERRORS, _AGGREGATOR) == 0
