"""Which steps kvscope treats as idle, on vLLM's real scheduler on CPU.

An idle step (nothing scheduled and no request left in vLLM: stores may still be pending,
which makes vLLM step) is aggregated synchronously on vLLM's thread, so that the state an
operator inspects afterwards (pending at idle) reaches vLLM's /metrics without another
step. A step that scheduled nothing while vLLM still holds requests (a load in flight,
async scheduling's outputs in flight) is not idle: vLLM steps again at once, and a
synchronous drain there would be kvscope's work on vLLM's critical path (on the H200
with async scheduling, ~1 ms per such step). The engine's own state is the oracle:
what vLLM's scheduler scheduled each step, and which requests it held then.
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


def _schedules(e: CPUEngine) -> list[tuple[bool, bool]]:
    """Per call of vLLM's scheduler: (it held requests, it scheduled nothing)."""
    seen, schedule = [], e.scheduler.schedule

    def observed(*a, **kw):
        held = bool(e.scheduler.requests)
        out = schedule(*a, **kw)
        seen.append((held, out.total_num_scheduled_tokens == 0))
        return out

    e.scheduler.schedule = observed
    return seen


def _waiting_for_load(e: CPUEngine) -> bool:
    """A request of vLLM's scheduler (any queue: they differ between versions) whose load
    runs."""
    return any(r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
               for r in e.scheduler.requests.values())


@pytest.mark.parametrize("tiering", [False, True])
def test_an_empty_step_is_idle_only_once_vllm_holds_no_request(tiering):
    with CPUEngine(EngineConfig(rows=64, tiering=tiering,
                                kvscope_options={"flush_interval_s": NEVER_S})) as e:
        target = prompt(1, 96)
        e.generate(target, 4)
        e.drain()
        assert e.scheduler.reset_prefix_cache()  # the re-ask must load from the CPU tier
        observer = e.connector._kvscope_observer
        refreshes, schedules = _refreshes(observer), _schedules(e)
        rid = e.add_request(target, 4)
        waited = 0
        busy_empty: list[int] = []  # refreshes of each empty step while vLLM held requests
        idle: list[int] = []  # refreshes of each empty step once it held none
        for _ in range(200):
            before, n = refreshes[0], len(schedules)
            e.step()
            waited += _waiting_for_load(e)  # this step scheduled nothing of it: it loads
            if len(schedules) == n + 1 and schedules[-1][1]:
                (busy_empty if schedules[-1][0] else idle).append(refreshes[0] - before)
            if rid in e.finished and idle:
                break
        assert e.finished[rid].num_external_tokens > 0  # it was restored, not recomputed
        assert waited > 0 and busy_empty  # a step that waited for its load scheduled nothing
        assert busy_empty == [0] * len(busy_empty)
        assert not observer._live  # it finished: vLLM holds nothing, nor does kvscope
        # the engine idle (the stores of its decode step it): refreshed at once, with the
        # load's round and the request's finish applied
        assert idle and all(idle)
        assert not observer.journal


def test_with_a_finish_hook_overridden_no_request_is_kept_and_every_empty_step_is_idle():
    """A further subclass that overrides ``request_finished`` hides finishes from kvscope:
    a kept request would then never leave (memory, and no idle step ever again). kvscope
    keeps none, and every step that schedules nothing refreshes at once, as before it
    kept them."""
    from kvscope.connector.observed import ObservedOffloadingConnector
    from kvscope.connector.scheduler import hooks

    class Finishing(ObservedOffloadingConnector):
        def request_finished(self, request, block_ids):
            return super().request_finished(request, block_ids)

    with CPUEngine(EngineConfig(rows=64, kvscope_options={"flush_interval_s": NEVER_S})) as e:
        target = prompt(1, 96)
        e.generate(target, 4)
        e.drain()
        assert e.scheduler.reset_prefix_cache()
        conn, observer = e.connector, e.connector._kvscope_observer
        conn.__class__ = Finishing  # as if built so: the hooks installed again
        for name in hooks.HOOKED:
            vars(conn).pop(name, None)
        hooks.install(conn, observer, ObservedOffloadingConnector)
        assert observer._live is None and "request_finished" not in vars(conn)
        refreshes, schedules = _refreshes(observer), _schedules(e)
        rid = e.add_request(target, 4)
        busy_empty: list[int] = []
        while rid not in e.finished:
            before, n = refreshes[0], len(schedules)
            e.step()
            if len(schedules) == n + 1 and schedules[-1] == (True, True):
                busy_empty.append(refreshes[0] - before)
            assert e.steps < 200
        assert e.finished[rid].num_external_tokens > 0
        assert busy_empty and all(busy_empty)  # the load wait: refreshed, as idle
