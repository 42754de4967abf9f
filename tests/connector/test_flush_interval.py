"""kvscope's ``flush_interval_s`` setting: the cadence of the scheduler side's aggregator
thread and of each rank's tally flush, on vLLM's real scheduler on CPU.

Whatever the cadence, a scrape of kvscope's own endpoint sees every event at once (the
synchronous drain) and vLLM's /metrics gets kvscope's series (the aggregator thread, or
the stats object a drain built); the engine's own counts are the oracle. A bad value is
refused when the connector is built."""

from __future__ import annotations

import math
import threading
import time

import pytest
from prometheus_client import REGISTRY, generate_latest
from vllm.v1.request import RequestStatus

from kvscope.connector import Settings
from kvscope.connector.aggregator import INTERVAL_S
from kvscope.exporters import signals as S
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt
from tests.connector.support import Exposition

pytestmark = pytest.mark.vllm

BUSY_S = 1.0  # wall time the engine is kept busy: 20 of the default cadence's wake-ups
NEVER_S = 3600.0  # a cadence no wake-up of which falls within a test
ANCHOR_TOKENS = 4000  # the request kept running while the engine is busy: never reached


def _engine(flush_interval_s: float, **kw) -> CPUEngine:
    return CPUEngine(EngineConfig(rows=32, tiering=False, world_size=2, vllm_metrics=True,
                                  kvscope_options={"flush_interval_s": flush_interval_s},
                                  **kw))


def _vllm_metrics() -> Exposition:
    """What vLLM's /metrics serves: the default prometheus-client registry."""
    return Exposition(generate_latest(REGISTRY).decode())


def _count_lookup_rounds(e: CPUEngine) -> list[int]:
    """The engine's own count of lookup rounds: vLLM's scheduler asking the connector."""
    asked, ask = [0], e.connector.get_num_new_matched_tokens

    def counted(*a, **kw):
        asked[0] += 1
        return ask(*a, **kw)

    e.connector.get_num_new_matched_tokens = counted
    return asked


def _step_busy(e: CPUEngine, until) -> None:
    """Step with vLLM holding a request throughout until ``until()``: neither an idle step
    nor the end of a step that finished vLLM's last request (both aggregate at once, the
    engine may not step again). A long request stays the whole time (aborted after), beside
    a new request per finished one, each with a shared prefix to look up."""
    shared, n, deadline = prompt(0, 32), 0, time.monotonic() + 60
    anchor = e.add_request(prompt(10**6, 16), ANCHOR_TOKENS)
    running: set[str] = set()
    try:
        while not until():
            running -= set(e.finished)
            while len(running) < 2:
                n += 1
                running.add(e.add_request(shared + prompt(n, 16), 24))
            e.step()
            assert anchor not in e.finished, "the long request ended: the engine idled"
            assert time.monotonic() < deadline, "engine busy for 60 s without the condition"
    finally:
        e.scheduler.finish_requests(anchor, RequestStatus.FINISHED_ABORTED)


def test_flush_interval_is_validated_at_start_up():
    assert Settings.from_extra_config({}).flush_interval_s == INTERVAL_S == 1.0
    for good in (0.5, 2, 1e-3):
        assert Settings.from_extra_config(
            {"kvscope": {"flush_interval_s": good}}).flush_interval_s == good
    for bad in (0, -0.05, math.nan, math.inf, "0.5", None, True):
        with pytest.raises(ValueError, match="flush_interval_s must be a finite number"):
            Settings.from_extra_config({"kvscope": {"flush_interval_s": bad}})
    # refused when vLLM builds the connector, before any engine runs
    with pytest.raises(ValueError, match="flush_interval_s"):
        _engine(0)


def test_the_setting_reaches_both_sides():
    with _engine(0.5) as e:
        assert e.connector._kvscope_observer.agg.interval_s == 0.5
        assert [r.connector.kvscope_worker.flush_interval_s for r in e.ranks] == [0.5, 0.5]


def test_a_long_cadence_still_reaches_vllm_and_a_scrape_sees_everything_at_once():
    """flush_interval_s=0.5: the aggregator thread wakes at most every 0.5 s (counted), yet
    kvscope's series reach vLLM's /metrics while the engine stays busy; a scrape of
    kvscope's endpoint agrees with the engine at once."""
    with _engine(0.5, exporter_port=0) as e:
        asked = _count_lookup_rounds(e)
        agg = e.connector._kvscope_observer.agg
        refreshes, refresh = [], agg._refresh

        def counted() -> None:  # the thread's refreshes, not the synchronous ones
            if threading.current_thread() is agg.thread:
                refreshes.append(time.monotonic())
            refresh()

        agg._refresh = counted
        t0 = time.monotonic()
        _step_busy(e, lambda: time.monotonic() - t0 >= BUSY_S
                   and _vllm_metrics().value(S.LOOKUP_ROUNDS.name) > 0)
        busy_s = time.monotonic() - t0
        assert 1 <= len(refreshes) <= busy_s / 0.5 + 1, (len(refreshes), busy_s)

        ours = Exposition.scrape(e.connector.kvscope_exporter.url)  # still busy: no idle step
        assert ours.value(S.LOOKUP_ROUNDS.name) == asked[0] > 0
        assert ours.value(S.SCHEDULER_STEPS.name) == e.steps
        # and vLLM's /metrics catches up with that scrape while the engine stays busy
        _step_busy(e, lambda: _vllm_metrics().value(S.LOOKUP_ROUNDS.name)
                   >= ours.value(S.LOOKUP_ROUNDS.name))


def test_a_cadence_longer_than_the_run_flushes_only_for_readers_and_idle_steps():
    """No aggregator wake-up falls within the run: while the engine is busy nothing of the
    scheduler side reaches vLLM (with the setting ignored, 50 ms wake-ups would hand it
    over); a scrape drains everything at once, and an idle step hands it to vLLM. (The
    thread may apply events meanwhile, woken by a journal past its bound, but flushes
    nothing: that stays at the cadence.)"""
    with _engine(NEVER_S, exporter_port=0) as e:
        asked = _count_lookup_rounds(e)
        observer = e.connector._kvscope_observer
        refreshes, refresh = [0], observer.agg._refresh

        def counted_refresh() -> None:
            refreshes[0] += 1
            refresh()

        observer.agg._refresh = counted_refresh
        t0 = time.monotonic()
        _step_busy(e, lambda: time.monotonic() - t0 >= BUSY_S)
        assert refreshes[0] == 0  # the thread never flushed
        assert _vllm_metrics().value(S.SCHEDULER_STEPS.name) == 0
        assert _vllm_metrics().value(S.LOOKUP_ROUNDS.name) == 0
        assert observer.journal or observer.agg.gauges_due  # events not flushed

        ours = Exposition.scrape(e.connector.kvscope_exporter.url)
        assert ours.value(S.LOOKUP_ROUNDS.name) == asked[0] > 0
        assert ours.value(S.SCHEDULER_STEPS.name) == e.steps
        assert not observer.journal
        e.drain()
        for _ in range(3):  # idle steps: each aggregates at once and hands vLLM the stats
            if _vllm_metrics().value(S.LOOKUP_ROUNDS.name) == asked[0]:
                break
            e.step()
        theirs, ours = _vllm_metrics(), Exposition.scrape(e.connector.kvscope_exporter.url)
        assert theirs.value(S.LOOKUP_ROUNDS.name) == ours.value(S.LOOKUP_ROUNDS.name) == asked[0]
        assert 0 < theirs.value(S.SCHEDULER_STEPS.name) <= ours.value(S.SCHEDULER_STEPS.name)
        assert refreshes[0] == 0


@pytest.mark.parametrize("interval_s", [0.5, NEVER_S])
def test_a_rank_flushes_a_busy_step_only_past_its_cadence(interval_s):
    """A rank's tally (real transfers, then one more job in flight each step) is pushed on a
    busy step once flush_interval_s has passed since the last push, not before."""
    with _engine(interval_s) as e:
        e.generate(prompt(1, 64), 4)
        w = e.ranks[0].connector.kvscope_worker
        tally = w._tally
        for job_id, since_s, pushed in ((10**6, 0.1, False), (10**6 + 1, 1.0, interval_s < 1)):
            tally.start_store(job_id, 1)  # what submit_store records
            w._flushed_at = time.monotonic() - since_s  # the last push, that long ago
            w.step()  # a busy step: a job started since the worker last looked
            assert tally.pending is not pushed, (interval_s, since_s)
