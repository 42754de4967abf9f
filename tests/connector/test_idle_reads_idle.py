"""Idle reads idle: once vLLM holds no request, kvscope's request gauges say so without
another step, on vLLM's real scheduler on CPU.

An engine stops stepping once it holds no request (vLLM's engine core waits for input; an
in-process ``LLM.generate`` returns after the step that finished its last output), so what
the last step leaves is what every later scrape reads. The shape of the GPU run that read a
false queue wait: concurrent re-asks of long prompts, restored whole from disk after waiting
for their promotions (held in flight, as a slow disk holds them), the engine driven as
``LLM.generate`` drives it, stepped until every output finished, then left alone. The
aggregator's wake-ups are taken in step with the engine (one before each step, as its
thread's may fall), so that the gauges hold the restore's busy states before the last
step. The oracle is the engine: vLLM's queues and requests, its connector's jobs, what
each re-ask got; never kvscope's counters.
"""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, generate_latest
from vllm.v1.request import RequestStatus

from kvscope.connector import compat
from kvscope.diagnostics import Thresholds, diagnose_scrape
from kvscope.exporters import signals as S
from kvscope.exporters.prometheus import start_exporter
from kvscope.sim.cpu_engine import CPUEngine
from kvscope.sim.oracle_geometry import REPORTED, generate
from kvscope.sim.plan_workload import Workload, ask_each, flood
from tests.connector.support import Exposition

pytestmark = pytest.mark.vllm

NEVER_S = 3600.0  # no wake-up of the aggregator's own thread within a test
# Incidents that read the state the engine is in now: none holds on an engine with no
# request and no transfer in flight
IDLE_FALSE = {"queue_wait", "pending_at_idle", "not_settled_at_idle", "promotion_stalled"}
# The gauges of unfinished things, all 0 once vLLM holds nothing and its transfers drained
UNFINISHED = (S.REQUESTS, S.REQUESTS_IN_FLIGHT, S.PENDING_TRANSFERS)
THRESHOLDS = Thresholds(pending_after_s=2.0)  # CPU copies: as the oracle matrix judges
SCRAPE_S = 0.2


def _scheduled(e: CPUEngine) -> list[set[str]]:
    """The ids vLLM's scheduler scheduled, per step from now on (the engine's truth)."""
    seen, schedule = [], e.scheduler.schedule

    def observed(*a, **kw):
        out = schedule(*a, **kw)
        seen.append(set(out.num_scheduled_tokens))
        return out

    e.scheduler.schedule = observed
    return seen


def _generate_as_vllm(e: CPUEngine, rids: list[str], budget: int) -> None:
    """Step as an in-process ``LLM.generate`` does, until every output finished, and no
    further; the aggregator woken before each step."""
    wake = e.connector._kvscope_observer.agg.wake
    for _ in range(budget):
        if all(r in e.finished for r in rids):
            return
        wake()
        e.step()
    raise AssertionError(f"re-asks not finished after {budget} steps")


def _vllm_idle(e: CPUEngine) -> bool:
    """vLLM holds no request (its queues and its request map: a finished request whose
    store runs stays there) and its connector no job."""
    s = e.scheduler
    return (s.get_num_unfinished_requests() == 0 and not s.requests
            and not compat.connector_jobs(e.connector.connector_scheduler))


def _unfinished(expo: Exposition) -> list[tuple[str, dict, float]]:
    """Every sample of the gauges of unfinished things that is not 0; each of them there."""
    assert all(expo.has(m.name) for m in UNFINISHED), [m.name for m in UNFINISHED]
    return [(m.name, labels, v) for m in UNFINISHED for labels, v in expo.series(m.name) if v]


def _exporter(e: CPUEngine):
    return start_exporter([e.connector.kvscope_recorder]
                          + [r.connector.kvscope_recorder for r in e.ranks], 0)


# The GPU run's proportions at an eighth of its length: prompt tokens, primary rows (1.38 x
# every re-ask's keys at once, as 22,060 rows for 4 x 4,000 keys), tokens a step (0.128 of a
# prompt, as 8,192 for 64,000)
REASKS = 4
SHAPE = (8_000, 2_760, 1_024)
HELD_STEPS = 3  # every promotion in flight this many steps: each re-ask waits for its rows


def test_concurrent_long_reasks_restored_after_waiting_leave_the_gauges_idle():
    tokens, rows, step = SHAPE
    work = Workload(concurrency=REASKS, prompt_tokens=tokens, step_tokens=step,
                    promotion_delay_steps=HELD_STEPS)
    with CPUEngine(work.engine_config(rows, vllm_metrics=True, kvscope_options={
            "flush_interval_s": NEVER_S})) as e:
        ask_each(e, work)
        flood(e, work, 0)
        scheduled = _scheduled(e)
        rids = [e.add_request(p, 2) for p in work.prompts()]
        _generate_as_vllm(e, rids, work.step_budget())
        # the engine's truth: each re-ask restored whole after waiting steps for its
        # promotions, and vLLM holds nothing, its transfers drained
        for rid in rids:
            assert e.finished[rid].num_external_tokens == tokens, (rid, e.finished[rid])
        first = [next(i for i, ids in enumerate(scheduled) if rid in ids) for rid in rids]
        assert min(first) >= HELD_STEPS, first  # none ran before its promotions landed
        assert _vllm_idle(e)
        # no step follows: kvscope's endpoint and vLLM's /metrics read the engine idle
        exporter = _exporter(e)
        try:
            ours = Exposition.scrape(exporter.url)
            assert ours.value(S.REQUESTS_IN_FLIGHT.name) == 0
            assert not _unfinished(ours), _unfinished(ours)
            theirs = Exposition(generate_latest(REGISTRY).decode())  # vLLM's /metrics
            assert not _unfinished(theirs), _unfinished(theirs)
            report = diagnose_scrape([exporter.url], interval=SCRAPE_S, thresholds=THRESHOLDS)
        finally:
            exporter.close()
        named = [v.id for v in report.verdicts]
        assert named[0] == "healthy", [(v.id, v.evidence) for v in report.verdicts]


def test_a_scrape_before_the_wake_up_leaves_the_gauges_to_it():
    """A further subclass that overrides ``request_finished`` hides the end of vLLM's last
    request from kvscope (no live set is kept): the step cannot settle, the aggregator's next
    wake-up does, though a scrape's drain applied the ends before it."""
    from kvscope.connector.observed import ObservedOffloadingConnector
    from kvscope.connector.scheduler import hooks

    class Finishing(ObservedOffloadingConnector):
        def request_finished(self, request, block_ids):
            return super().request_finished(request, block_ids)

    work = Workload(concurrency=2, prompt_tokens=2_048, step_tokens=512,
                    promotion_delay_steps=HELD_STEPS)
    with CPUEngine(work.engine_config(256, kvscope_options={"flush_interval_s": NEVER_S})) as e:
        ask_each(e, work)
        flood(e, work, 0)
        conn, observer = e.connector, e.connector._kvscope_observer
        conn.__class__ = Finishing  # as if built so: the hooks installed again
        for name in hooks.HOOKED:
            vars(conn).pop(name, None)
        hooks.install(conn, observer, ObservedOffloadingConnector)
        assert observer._live is None
        rids = [e.add_request(p, 2) for p in work.prompts()]
        _generate_as_vllm(e, rids, work.step_budget())
        assert all(e.finished[r].num_external_tokens > 0 for r in rids)
        assert _vllm_idle(e)
        exporter = _exporter(e)
        try:
            Exposition.scrape(exporter.url)  # drains the journal: the ends applied
            assert not observer.journal
            observer.agg.wake()  # the next wake-up, with no event left to apply
            ours = Exposition.scrape(exporter.url)
        finally:
            exporter.close()
        assert not _unfinished(ours), _unfinished(ours)


# The sweep: oracle geometries (the CI subset's seed, and those reproduced from GPU runs),
# each engine scraped at idle. Kept to the small ones: the point is the idle read, not
# the geometry's own verdict (test_oracle_matrix.py).
SWEEP = {g.name: g for g in generate(0, 24) if g.chunks * g.concurrency <= 48}
SWEEP.update({name: g for name, g in REPORTED.items()})


@pytest.mark.parametrize("name", sorted(SWEEP))
def test_oracle_geometries_read_idle_at_idle(name):
    """Each geometry's re-asks stepped as ``LLM.generate`` steps them; a livelocked one
    aborted (a client gives up), after which vLLM steps while it holds anything, as its
    engine core does; then no step: kvscope's endpoint reads nothing unfinished and
    kv-diagnose names no incident of the engine's present state."""
    geom = SWEEP[name]
    with CPUEngine(geom.engine_config(kvscope_options={"flush_interval_s": NEVER_S})) as e:
        for p in geom.prompts():
            e.generate(p, geom.ask_tokens, max_steps=2_000)
            e.drain()
        for f in geom.flood_prompts():
            e.generate(f, geom.flood_tokens, max_steps=2_000)
            e.drain()
        rids = [e.add_request(p, geom.ask_tokens) for p in geom.prompts()]
        budget = 4 * geom.concurrency * geom.prompt_tokens // geom.step_tokens + 200
        try:
            _generate_as_vllm(e, rids, budget)
        except AssertionError:  # livelocked: the client gives up
            e.scheduler.finish_requests([r for r in rids if r not in e.finished],
                                        RequestStatus.FINISHED_ABORTED)
        wake = e.connector._kvscope_observer.agg.wake
        for _ in range(200):  # stores of the last step, an abort: vLLM steps on
            if _vllm_idle(e) and not e.scheduler.has_requests():
                break
            wake()
            e.step()
        assert _vllm_idle(e)
        exporter = _exporter(e)
        try:
            ours = Exposition.scrape(exporter.url)
            report = diagnose_scrape([exporter.url], interval=SCRAPE_S, thresholds=THRESHOLDS)
        finally:
            exporter.close()
        assert not _unfinished(ours), _unfinished(ours)
        named = {v.id for v in report.verdicts}
        assert not named & IDLE_FALSE, [(v.id, v.evidence) for v in report.verdicts]
