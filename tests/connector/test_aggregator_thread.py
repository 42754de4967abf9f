"""kvscope's aggregator thread alive or dead, the counters are the same and agree with what
the engine did; a dead one is counted (``kvscope_telemetry_errors_total{where="aggregator"}``)
and vLLM's scheduler thread drains the journal itself, so it stays bounded."""

from __future__ import annotations

import threading

import pytest

from kvscope.connector.aggregator import journal_events
from kvscope.exporters import signals as S
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt
from kvscope.sim.scenarios import PROMPT_TOKENS, _ask_then_flood

pytestmark = pytest.mark.vllm

LIMIT = 4  # journal items past which the scheduler thread drains itself (dead thread)


def _run(kill_aggregator: bool) -> dict:
    with CPUEngine(EngineConfig(rows=12)) as e:
        observer = e.connector._kvscope_observer
        if kill_aggregator:
            observer.agg.close()
            observer.agg.limit = LIMIT
        # the engine's own count of lookup rounds: vLLM's scheduler asking the connector
        lookups, ask = [0], e.connector.get_num_new_matched_tokens

        def counted(*a, **kw):
            lookups[0] += 1
            return ask(*a, **kw)

        e.connector.get_num_new_matched_tokens = counted
        target = prompt(1, PROMPT_TOKENS)
        _ask_then_flood(e, target, PROMPT_TOKENS)
        again = e.generate(target, 4, max_steps=200)
        journal_at_most = journal_events(observer.journal)  # whole events, or it raises
        e.drain()
        rec = e.connector.kvscope_recorder
        return {
            "rounds": {v.value: rec.value(S.LOOKUP_ROUNDS, (v.value,)) for v in S.Verdict},
            "hit_tokens": rec.value(S.HIT_TOKENS),
            "steps": rec.value(S.SCHEDULER_STEPS),
            "steps_by_engine": e.steps,
            "lookups_by_engine": lookups[0],
            "restored_by_engine": sum(f.num_external_tokens for f in e.finished.values()),
            "restored_again": again.num_external_tokens,
            "errors": rec.value(S.TELEMETRY_ERRORS, (S.ErrorSite.AGGREGATOR.value,)),
            "alive": observer.agg.alive(),
            "journal": journal_at_most,
        }


def test_a_dead_aggregator_is_counted_and_changes_no_counter():
    alive, dead = _run(kill_aggregator=False), _run(kill_aggregator=True)
    # Each run against its own engine: on a loaded box the two engines need not take the
    # same number of steps (a step more or less waiting), so they are not compared.
    for run in (alive, dead):  # the oracle: what the engine did
        assert run["restored_again"] > 0
        assert run["hit_tokens"] == run["restored_by_engine"]
        assert run["steps"] == run["steps_by_engine"]
        assert sum(run["rounds"].values()) == run["lookups_by_engine"]
        assert run["rounds"]["hit"] > 0
    assert alive["alive"] and alive["errors"] == 0
    assert not dead["alive"] and dead["errors"] > 0
    assert dead["journal"] <= 8  # events: drained by the scheduler thread as it went


def _until(cond, what: str, timeout: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _restore_in_flight(e: CPUEngine):
    """A prompt flooded out to disk, asked again: its promotion held in flight (a slow disk,
    promotion_delay_steps) while the test does not step the engine."""
    target = prompt(1, PROMPT_TOKENS)
    first = _ask_then_flood(e, target, PROMPT_TOKENS)
    rid = e.add_request(target, 4)
    for _ in range(3):
        e.step()
    observer = e.connector._kvscope_observer
    assert observer.taps.promotions and rid not in e.finished  # engine truth: it waits
    return observer, rid, first


FAST = {"flush_interval_s": 0.02}


def test_the_aggregator_holds_back_while_a_restore_reads_then_drains():
    """vLLM's fs read threads need the GIL between their system calls; beside vLLM's engine
    thread re-scanning the waiting request every step they get little of it, and the
    aggregator's draining took from that little (docs/measured-facts.md; kvscope.sim.restore_convoy). So
    it waits while a promotion is in flight, and catches up once it landed: every event
    applied, counters equal to what the engine restored."""
    with CPUEngine(EngineConfig(rows=12, promotion_delay_steps=100,
                                kvscope_options=FAST)) as e:
        observer, rid, _ = _restore_in_flight(e)
        held = observer.agg.hold_back.held
        _until(lambda: observer.agg.hold_back.held >= held + 10, "10 wake-ups held back")
        assert observer.journal  # the steps' events wait, none applied beside the reads
        e.run_until_done([rid])
        e.drain()
        _until(lambda: not observer.journal, "the journal drained after the restore")
        restored = sum(f.num_external_tokens for f in e.finished.values())
        rec = e.connector.kvscope_recorder
        assert e.finished[rid].num_external_tokens > 0
        assert rec.value(S.HIT_TOKENS) == restored
        assert rec.value(S.SCHEDULER_STEPS) == e.steps
        assert rec.value(S.TELEMETRY_ERRORS) == 0


def test_a_restore_that_never_lands_holds_the_aggregator_back_at_most_max_defer_s():
    """A read that never completes (a stalled disk) must not stop aggregation: after
    max_defer_s the journal is drained anyway, the promotion still in flight."""
    with CPUEngine(EngineConfig(rows=12, promotion_delay_steps=100,
                                kvscope_options=FAST)) as e:
        observer, rid, _ = _restore_in_flight(e)
        observer.agg.hold_back.max_s = 0.3
        _until(lambda: not observer.journal, "the journal drained past max_defer_s")
        assert observer.taps.promotions and rid not in e.finished
        assert observer.agg.hold_back.held >= 1
        e.run_until_done([rid])


def test_a_burst_shorter_than_the_interval_is_applied_on_the_aggregator_thread():
    """A burst of 300 requests with the aggregator's interval an hour: each step whose
    journal passed the wake bound wakes the thread, which applies it (the test waits for
    it, as vLLM's forward pass would let it run); so the step that leaves the engine idle
    (SchedulerObserver.settle) applies on vLLM's thread at most the bound and a step's
    events, not the whole burst. The counters still agree with the engine."""
    from kvscope.sim.lockstep import OBSERVED, add_requests, engine

    with engine(OBSERVED, tiering=False, flush_interval_s=3600.0) as e:
        observer = e.connector._kvscope_observer
        agg, drain = observer.agg, observer.agg.drain
        drained_here: list[int] = []  # journal items each drain on this thread found
        drained_there: list[int] = []  # and on the aggregator's

        def watched() -> None:
            here = threading.current_thread() is threading.main_thread()
            (drained_here if here else drained_there).append(len(agg.journal))
            drain()

        agg.drain = watched
        lookups, ask = [0], e.connector.get_num_new_matched_tokens

        def counted(*a, **kw):
            lookups[0] += 1
            return ask(*a, **kw)

        e.connector.get_num_new_matched_tokens = counted
        rids = add_requests(e, 300)
        most_in_a_step = 0
        while any(r not in e.finished for r in rids):
            before = len(agg.journal)
            e.step()
            if drained_here:  # the step that left the engine idle drained (settle)
                break
            most_in_a_step = max(most_in_a_step, len(agg.journal) - before)
            if len(agg.journal) > agg.wake_at:
                _until(lambda: len(agg.journal) <= agg.wake_at, "the thread caught up")
        assert all(r in e.finished for r in rids)
        assert len(drained_there) >= 2  # a burst the bound split, applied on that thread
        assert drained_here and max(drained_here) <= agg.wake_at + most_in_a_step
        e.drain()
        rec = e.connector.kvscope_recorder
        restored = sum(e.finished[r].num_external_tokens for r in rids)
        assert rec.value(S.HIT_TOKENS) == restored
        assert sum(rec.value(S.LOOKUP_ROUNDS, (v.value,)) for v in S.Verdict) == lookups[0]
        assert rec.value(S.SCHEDULER_STEPS) == e.steps
        assert rec.value(S.REQUESTS_IN_FLIGHT) == 0  # vLLM holds none: idle reads idle
        assert rec.value(S.TELEMETRY_ERRORS) == 0
