"""kvscope's aggregator thread (connector/aggregator.py) on its own: events applied in the
order they were recorded, on its thread; a failing event counted and the rest applied;
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
