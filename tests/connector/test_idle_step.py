"""Which steps kvscope treats as idle, on vLLM's real scheduler on CPU.

An idle step (nothing scheduled, and nothing waiting that makes vLLM step again) is
aggregated synchronously on vLLM's thread, so that the state an operator inspects
afterwards (pending at idle) reaches vLLM's /metrics without another step. A step that
scheduled nothing while a request waits for its load is not idle: vLLM steps again at once,
and the synchronous drain there would be kvscope's work on vLLM's critical path (on the
H200 with async scheduling, ~1 ms per such step). The engine's own state is the oracle:
which requests wait for remote KV (vLLM's request status) at each step.
"""

from __future__ import annotations

import pytest
from vllm.v1.request import RequestStatus

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

pytestmark = pytest.mark.vllm

NEVER_S = 3600.0  # no aggregator wake-up within the test: only synchronous drains apply


def _refreshes(observer) -> list[int]:
    """Counts synchronous refreshes (the observer's own attribute shadows the method)."""
    n, inner = [0], observer.refresh

    def counted(*a, **kw):
        n[0] += 1
        return inner(*a, **kw)

    observer.refresh = counted
    return n


def _waiting_for_load(e: CPUEngine) -> bool:
    """A request of vLLM's scheduler (any queue: they differ between versions) whose load
    runs."""
    return any(r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
               for r in e.scheduler.requests.values())


@pytest.mark.parametrize("tiering", [False, True])
def test_a_step_waiting_for_a_load_is_not_idle_the_idle_step_after_it_is(tiering):
    with CPUEngine(EngineConfig(rows=64, tiering=tiering,
                                kvscope_options={"flush_interval_s": NEVER_S})) as e:
        target = prompt(1, 96)
        e.generate(target, 4)
        e.drain()
        assert e.scheduler.reset_prefix_cache()  # the re-ask must load from the CPU tier
        observer = e.connector._kvscope_observer
        refreshes = _refreshes(observer)
        rid = e.add_request(target, 4)
        waited = refreshed_while_waiting = received = 0
        while rid not in e.finished:
            before = refreshes[0]
            e.step()
            if _waiting_for_load(e):  # this step scheduled nothing of it: its load runs
                waited += 1
                refreshed_while_waiting += refreshes[0] - before
            if rid in e.scheduler.finished_recving_kv_req_ids:  # received, not yet run
                received += 1
                assert rid not in observer._loading
            assert e.steps < 200
        assert e.finished[rid].num_external_tokens > 0  # it was restored, not recomputed
        assert waited > 0 and received > 0
        assert refreshed_while_waiting == 0
        assert not observer._loading  # it finished: nothing waits
        # the engine idle now (stores of its decode may still step it): an idle step
        # refreshes at once, with the load's round and the request's finish applied
        before = refreshes[0]
        for _ in range(3):
            e.step()
        assert refreshes[0] > before
        assert not observer.journal
