"""kvscope's aggregator thread alive or dead, the counters are the same and agree with what
the engine did; a dead one is counted (``kvscope_telemetry_errors_total{where="aggregator"}``)
and vLLM's scheduler thread drains the journal itself, so it stays bounded."""

from __future__ import annotations

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
