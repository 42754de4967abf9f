"""Settled at idle: what vLLM's GPU block pool still holds once nothing is in flight, on
vLLM's real scheduler on CPU.

kvscope reads the pool vLLM's scheduler binds to its connector, at the end of each step
that left no request known to the connector and no load or store job in flight
(``kvscope_idle_gpu_blocks_in_use``), and with every gauge refresh
(``kvscope_gpu_blocks``). A real fault makes the engine idle holding blocks: the test hook
``leak_blocks`` (kvscope/sim/faults.py) gives each finishing request's blocks one reference
in vLLM's pool that nothing releases. The oracle is the engine itself: the reference
counts of its pool's blocks (``kvscope.sim.scenarios.gpu_blocks_held``), never kvscope's
gauges. No aggregator wake-up falls within these runs: what reaches the recorder and
vLLM's /metrics comes from the steps themselves.
"""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, generate_latest

from kvscope.exporters import signals as S
from kvscope.sim import faults
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt
from kvscope.sim.scenarios import gpu_blocks_held
from tests.connector.support import Exposition

pytestmark = pytest.mark.vllm

NEVER_S = 3600.0  # no aggregator wake-up within a test
IN_USE = (S.GpuBlockState.IN_USE.value,)
TOTAL = (S.GpuBlockState.TOTAL.value,)


def _engine(fault: str | None = None, **kw) -> CPUEngine:
    return CPUEngine(EngineConfig(rows=64, world_size=2, kv_groups=2, num_gpu_blocks=40,
                                  max_num_batched_tokens=16, vllm_metrics=True, fault=fault,
                                  kvscope_options={"flush_interval_s": NEVER_S}, **kw))


def _vllm_metrics() -> Exposition:
    """What vLLM's /metrics serves: the default prometheus-client registry."""
    return Exposition(generate_latest(REGISTRY).decode())


@pytest.mark.parametrize("fault", [None, faults.LEAK_BLOCKS])
def test_idle_blocks_are_what_vllms_pool_holds(fault):
    with _engine(fault) as e:
        rec = e.connector.kvscope_recorder
        assert rec.value(S.GPU_BLOCKS, TOTAL) == e.cfg.num_gpu_blocks - 1  # its null block
        assert rec.value(S.IDLE_GPU_BLOCKS) == 0  # bound before the first step: nothing held
        rid = e.add_request(prompt(1, 48), 4)
        busy = []
        while rid not in e.finished:
            e.step()
            if rid not in e.finished:  # a step that left the request running
                e.refresh()
                busy.append((gpu_blocks_held(e), rec.value(S.GPU_BLOCKS, IN_USE),
                             rec.value(S.IDLE_GPU_BLOCKS)))
        e.generate(prompt(2, 48), 4)
        e.drain()
        held = gpu_blocks_held(e)  # the engine's own pool
        assert not e.scheduler.has_requests() and len(e.finished) == 2
        # while the request ran its blocks were in use (the first step may only look it
        # up), read as such, and nothing was read as idle
        assert max(truth for truth, _, _ in busy) > 0, busy
        assert all(in_use == truth and idle == 0 for truth, in_use, idle in busy), busy
        if fault is None:
            assert held == 0
        else:  # both requests' blocks: 51 tokens computed = 4 blocks, in each of 2 KV groups
            assert held == 2 * 4 * 2
        assert rec.value(S.IDLE_GPU_BLOCKS) == held
        assert rec.value(S.GPU_BLOCKS, IN_USE) == held
        # vLLM's /metrics got it from the steps' own stats objects (no wake-up meanwhile)
        assert _vllm_metrics().value(S.IDLE_GPU_BLOCKS.name) == held


def test_a_job_in_flight_is_not_settled():
    """Rank 1 never reports its store jobs (pending at idle) while blocks leak: with a
    store job in flight the engine has not settled, so the idle gauge keeps its value;
    kvscope_gpu_blocks still shows the pool."""
    with _engine(faults.LEAK_BLOCKS,
                 stuck=lambda rank, kind, job: rank == 1 and kind == "store") as e:
        rec = e.connector.kvscope_recorder
        e.generate(prompt(1, 48), 2)
        for _ in range(5):
            e.step()
        e.refresh()
        held = gpu_blocks_held(e)
        assert held > 0 and e.scheduler.has_requests()  # leaked, and the store still pending
        assert rec.value(S.PENDING_TRANSFERS, (S.PendingKind.STORE.value,)) > 0
        assert rec.value(S.REQUESTS_IN_FLIGHT) == 0
        assert rec.value(S.IDLE_GPU_BLOCKS) == 0
        assert rec.value(S.GPU_BLOCKS, IN_USE) == held


def test_host_memory_sampled_on_a_quiet_wake_up():
    """The aggregator thread's wake-ups without events sample the host's memory (when
    due): called here directly, once, on a real engine's observer."""
    with _engine() as e:
        obs, rec = e.connector._kvscope_observer, e.connector.kvscope_recorder
        host = obs.gauges.host
        e.refresh()  # the gauges' refresh samples it
        taken = host.samples
        assert taken == 1
        obs.quiet()  # not due: sampled moments ago
        assert host.samples == taken
        host.interval_s = 0.0
        obs.quiet()
        assert host.samples == taken + 1
        assert rec.value(S.HOST_MEMORY_AVAILABLE) > 0
        assert rec.value(S.PROCESS_RESIDENT_MEMORY) > 0
