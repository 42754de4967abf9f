"""The within-process A/B's switch (kvscope.sim.kvscope_switch) on vLLM's real scheduler:
off must be vLLM's own path (its manager, its worker, the tiers' own methods; kvscope sees
nothing) and on must be kvscope as loaded again. Judged by what the engine restored."""

from __future__ import annotations

import time

import pytest

from kvscope.connector import ObservedOffloadingConnector
from kvscope.connector.compat import WRAPPED_MARK
from kvscope.connector.compat.vllm_api import OffloadingConnector
from kvscope.exporters import signals as S
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig
from kvscope.sim.cpu_model import prompt
from kvscope.sim.kvscope_switch import KvscopeSwitch, NotQuiet, quiet

pytestmark = pytest.mark.vllm


def _hits(e: CPUEngine) -> float:
    e.refresh()
    snap = e.connector.kvscope_recorder.snapshot()
    return sum(v for (m, _), v in snap.counters.items() if m is S.HIT_TOKENS)


def _flood(e: CPUEngine, seeds) -> None:
    for seed in seeds:  # out of the GPU prefix cache, into the tiers
        e.generate(prompt(seed, 96), 2)
    e.drain()


def connectors(e: CPUEngine) -> list:
    return [r.connector for r in e.ranks]


def _settle(e: CPUEngine) -> None:
    for _ in range(50):
        if quiet(e.scheduler):
            return
        e.step()
    raise AssertionError("engine not quiet after 50 steps")


@pytest.mark.parametrize("tiering", [False, True], ids=["cpu", "tiering"])
def test_off_is_vllms_own_path_and_on_is_kvscope_again(tiering):
    with CPUEngine(EngineConfig(rows=64, num_gpu_blocks=16, tiering=tiering)) as e:
        switch = KvscopeSwitch(e.scheduler, [r.connector for r in e.ranks])
        first = e.generate(prompt(3, 96), 2)
        _flood(e, (4, 5, 6))
        _settle(e)
        switch.set(False)
        assert all(type(c) is OffloadingConnector for c in (e.connector, *connectors(e)))
        assert e.connector.connector_scheduler.manager is switch.manager
        assert not getattr(switch.manager, WRAPPED_MARK, False)
        assert all(r.connector.connector_worker.worker is inner
                   for r, (_, _, inner) in zip(e.ranks, switch.workers, strict=True))
        assert switch.hooks and not set(switch.hooks) & set(vars(e.connector))  # the class's
        for tier, taps in switch.tier_taps:
            for name, tap in taps.items():  # the class's method again, or vLLM's own
                own = vars(tier).get(name)  # instance attribute (the primary's prepare_write)
                assert own is None or own is getattr(tap, "__wrapped__", None), name
        if tiering:
            assert any(taps for _, taps in switch.tier_taps)  # there were taps to remove
        else:  # the prefix scan's tap (the CPU tier alone, one KV group) was there to remove
            assert switch.cs_taps
        assert not set(switch.cs_taps) & set(vars(e.connector.connector_scheduler))
        hits_before = _hits(e)
        off = e.generate(prompt(3, 96), 2)
        _flood(e, (7, 8, 9))
        _settle(e)
        assert off.num_external_tokens == 96, off  # the premise: restored from the tiers
        assert off.output == first.output
        assert _hits(e) == hits_before  # kvscope saw nothing while off

        switch.set(True)
        assert all(type(c) is ObservedOffloadingConnector
                   for c in (e.connector, *connectors(e)))
        assert e.connector.connector_scheduler.manager is switch.manager_proxy
        assert set(switch.cs_taps) <= set(vars(e.connector.connector_scheduler))
        hits_before = _hits(e)
        on = e.generate(prompt(3, 96), 2)
        e.drain()
        assert on.num_external_tokens == 96, on
        assert on.output == first.output
        assert _hits(e) - hits_before == on.num_external_tokens  # kvscope sees again


def _until(done, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_tier_probe_waits_while_kvscope_is_off_and_probes_again_once_on():
    # off is the stock path: the probe's checks of the fs tier's files (os.stat per sampled
    # key) must not run beside the off arm's restores, which its busy test cannot see
    with CPUEngine(EngineConfig(rows=64, num_gpu_blocks=16, tiering=True,
                                kvscope_options={"tier_probe_interval_s": 0.05})) as e:
        switch = KvscopeSwitch(e.scheduler, [r.connector for r in e.ranks])
        probe = switch.observer.probe
        _flood(e, (4, 5, 6))  # keys on disk for the probe to check
        _settle(e)
        p0 = probe.probes
        _until(lambda: probe.probes >= p0 + 3)  # on and idle: it probes
        switch.set(False)
        held0, p1 = probe.hold_back.held, probe.probes
        _until(lambda: probe.hold_back.held >= held0 + 20)  # ~1 s of its wake-ups, all held
        assert probe.probes <= p1 + 1  # at most the one under way as the switch happened
        switch.set(True)
        p2 = probe.probes
        _until(lambda: probe.probes >= p2 + 3)


def test_a_switch_with_a_request_in_flight_is_refused():
    with CPUEngine(EngineConfig(rows=64, num_gpu_blocks=16)) as e:
        switch = KvscopeSwitch(e.scheduler, [r.connector for r in e.ranks])
        rid = e.add_request(prompt(3, 96), 8)
        e.step()
        with pytest.raises(NotQuiet):
            switch.set(False)
        assert switch.on and e.connector._kvscope_observer is switch.observer
        e.run_until_done([rid])
        _settle(e)
        switch.set(False)
        assert not switch.on


def test_clocks_on_the_connectors_time_what_each_state_calls():
    """The GPU A/B's per-call clocks (kvscope.sim.call_clock) wrap the connectors'
    methods; across a switch they must wrap vLLM's own methods while off (a wrapper left
    in place would keep calling kvscope's) and kvscope's hooks while on, and count both."""
    from kvscope.sim.call_clock import CallClock

    with CPUEngine(EngineConfig(rows=64, num_gpu_blocks=16)) as e:
        switch = KvscopeSwitch(e.scheduler, connectors(e))
        sched = CallClock().wrap(e.connector, "get_num_new_matched_tokens")
        worker = CallClock().wrap(connectors(e)[0], "get_finished")
        switch.clocks += [sched, worker]
        hook = switch.hooks["get_num_new_matched_tokens"]
        assert e.connector.get_num_new_matched_tokens.inner is hook
        e.generate(prompt(3, 96), 2)
        _settle(e)
        counted = sched.calls, worker.calls
        assert all(counted)

        switch.set(False)
        inner = e.connector.get_num_new_matched_tokens.inner
        assert inner.__func__ is OffloadingConnector.get_num_new_matched_tokens
        assert connectors(e)[0].get_finished.inner.__func__ is OffloadingConnector.get_finished
        e.generate(prompt(4, 96), 2)
        _settle(e)
        assert sched.calls > counted[0] and worker.calls > counted[1]

        switch.set(True)
        assert e.connector.get_num_new_matched_tokens.inner is hook
        assert (connectors(e)[0].get_finished.inner.__func__
                is ObservedOffloadingConnector.get_finished)


def test_promotion_count_reads_vllms_promotions_in_both_states():
    """gpu_scale's promotion probe (kvscope.sim.promotion_count) counts the keys vLLM's
    tiering manager promoted from the fs tier, on top of whatever the tier's methods are
    (kvscope's taps while on, vLLM's own while off). Judged by what the engine loaded: with
    the prompt's rows evicted from a 16-row primary tier, every restored key was promoted."""
    from kvscope.sim.promotion_count import PromotionCount

    with CPUEngine(EngineConfig(rows=16, num_gpu_blocks=16, tiering=True)) as e:
        switch = KvscopeSwitch(e.scheduler, connectors(e))
        promotions = PromotionCount(switch.manager)
        switch.clocks.append(promotions)
        first = e.generate(prompt(3, 96), 2)
        for on, floods in ((False, (4, 5, 6)), (True, (7, 8, 9))):
            _flood(e, floods)  # 18 rows: the prompt's 6 leave the primary tier
            _settle(e)
            switch.set(on)
            before = promotions.snapshot()
            again = e.generate(prompt(3, 96), 2)
            e.drain()
            jobs, keys, failed = (b - a for a, b in zip(before, promotions.snapshot()))
            assert again.num_external_tokens == 96, again  # restored, all of it
            assert again.output == first.output
            assert keys == 96 // 16, (on, keys)
            assert 1 <= jobs <= keys and failed == 0
            assert not promotions._started  # every job seen completing (its read timed)
            assert promotions.longest_job_s > 0
