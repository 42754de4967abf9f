"""A request's end lost to an error of kvscope's (``lose_finishes``: kvscope/sim/faults.py)
must not leave kvscope's books wrong once the error is behind: kv-diagnose judges only
windows that hold the error, so a request counted forever (``kvscope_requests``), or every
later idle step read as busy (its state never reaching vLLM's /metrics), would outlive it.

The oracle is vLLM's: its scheduler holds no request once drained, so kvscope must count
none. Without the reconciliation (SchedulerObserver._forget_gone) the lost request stays
counted, running, and kvscope's live set keeps it.
"""

from __future__ import annotations

import pytest

from kvscope.exporters import signals as S
from kvscope.exporters.signals import ErrorSite, RequestState
from kvscope.sim import faults
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt
from kvscope.sim.scenario_run import wait_until

pytestmark = pytest.mark.vllm


@pytest.fixture
def finishes_lost(tmp_path, monkeypatch):
    path = str(tmp_path / "fault.json")
    faults.write_fault(path, faults.LOSE_FINISHES)
    monkeypatch.setenv(faults.ENV, path)  # read when the connector is built
    return path


@pytest.mark.parametrize("tiering", [False, True], ids=["cpu", "tiering"])
def test_a_lost_request_end_is_forgotten_once_vllm_holds_it_no_more(finishes_lost, tiering):
    with CPUEngine(EngineConfig(rows=64, tiering=tiering, fault_hooks=True)) as e:
        obs = e.connector._kvscope_observer
        rec = e.connector.kvscope_recorder
        lost = e.generate(prompt(1, 96), 2)
        e.refresh()
        # the premise: the end was lost on both threads, and counted
        for site in (ErrorSite.STEP, ErrorSite.AGGREGATOR):
            assert rec.value(S.TELEMETRY_ERRORS, (site.value,)) > 0, site
        assert lost.request_id in obs._live
        assert rec.value(S.REQUESTS_IN_FLIGHT) >= 1

        faults.write_fault(finishes_lost, None)
        assert wait_until(lambda: not obs._live.switch.active(faults.LOSE_FINISHES))
        e.generate(prompt(2, 96), 2)
        e.drain()
        assert not e.scheduler.has_requests()  # the oracle: vLLM holds no request
        assert not obs._live
        assert rec.value(S.REQUESTS_IN_FLIGHT) == 0
        for state in RequestState:
            assert rec.value(S.REQUESTS, (state.value,)) == 0, state
