"""A rank's transfer tally (connector/worker/tally.py): what it pushes into the recorder,
and so into vLLM's stats delta, is what the per-job recording did: bytes and durations of
the successful jobs per direction, the jobs in flight, sizes vLLM did not report from the
job's blocks. vLLM's own TransferResult; a real Recorder."""

from __future__ import annotations

import pytest

from kvscope.connector.compat.vllm_api import TransferResult
from kvscope.connector.worker.tally import TransferTally
from kvscope.exporters import signals as S
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import Direction

pytestmark = pytest.mark.vllm

STORE, LOAD = ("3", Direction.GPU_TO_CPU.value), ("3", Direction.CPU_TO_GPU.value)


def test_push_carries_what_finished_and_what_is_in_flight():
    rec = Recorder()
    tally = TransferTally(rec, "3")
    tally.start_store(1, 2)
    tally.start_store(2, 2)
    tally.start_load(3, 4)
    tally.start_load(3, 4)  # a job id reused while in flight: once
    assert tally.active and tally.pending
    tally.push()
    assert not tally.pending
    assert rec.value(S.TRANSFERS_IN_FLIGHT, STORE) == 2
    assert rec.value(S.TRANSFERS_IN_FLIGHT, LOAD) == 1
    rec.take_delta()

    seen = []
    tally.finish([TransferResult(1, True, 100, 0.5), TransferResult(2, False, 100, 0.5),
                  TransferResult(3, True, None, None), TransferResult(99, True, 7, 0.1)],
                 slot_size=1000, on_transfer=lambda *a: seen.append(a))
    assert rec.value(S.TRANSFER_BYTES, STORE) == 0  # nothing reaches the recorder per job
    tally.push()
    assert rec.value(S.TRANSFER_BYTES, STORE) == 100  # the failed job counts nothing
    assert rec.value(S.TRANSFER_BYTES, LOAD) == 4 * 1000  # blocks x slot when unreported
    assert rec.value(S.TRANSFER_SECONDS, STORE) == 1
    assert rec.value(S.TRANSFER_SECONDS, LOAD) == 1
    assert rec.value(S.TRANSFERS_IN_FLIGHT, STORE) == 0
    assert rec.value(S.TRANSFERS_IN_FLIGHT, LOAD) == 0
    assert [(j, d) for j, d, _, _ in seen] == [(1, Direction.GPU_TO_CPU), (3, Direction.CPU_TO_GPU)]
    assert seen[1][3] >= 0  # a duration since submission when vLLM reports none

    delta = rec.take_delta()  # what vLLM's stats hook hands over: the same values
    assert delta.counters[(S.TRANSFER_BYTES, STORE)] == 100
    assert delta.counters[(S.TRANSFER_BYTES, LOAD)] == 4000
    assert delta.observations[(S.TRANSFER_SECONDS, STORE)] == [0.5]
    assert delta.gauges[(S.TRANSFERS_IN_FLIGHT, STORE)] == 0
    assert delta.gauges[(S.TRANSFERS_IN_FLIGHT, LOAD)] == 0

    tally.push()  # nothing new: nothing into the delta
    assert rec.take_delta().is_empty()


def test_the_stats_object_is_vllms_own_build_value_by_value():
    """What a rank hands vLLM's stats hook (stats_from_delta: a histogram's observations as
    one list per label values) equals vLLM's OffloadingConnectorStats filled one
    observe_histogram call per observation, and leaves the delta as it was."""
    from kvscope.connector.compat.vllm_api import OffloadingConnectorStats
    from kvscope.connector.export.vllm_stats import stats_from_delta

    rec = Recorder()
    rec.inc(S.TRANSFER_BYTES, STORE, 100)
    rec.observe_many(S.TRANSFER_SECONDS, STORE, [0.5, 0.25, 0.125])
    rec.observe_many(S.TRANSFER_SECONDS, LOAD, [2.0])
    rec.set(S.TRANSFERS_IN_FLIGHT, STORE, 3)
    rec.flush()
    delta = rec.take_delta()
    kept = {k: list(v) for k, v in delta.observations.items()}
    theirs = OffloadingConnectorStats()
    for (metric, labels), value in delta.counters.items():
        theirs.increase_counter(metric.name, value, labels)
    for (metric, labels), value in delta.gauges.items():
        theirs.set_gauge(metric.name, value, labels)
    for (metric, labels), values in delta.observations.items():
        for v in values:
            theirs.observe_histogram(metric.name, v, labels)
    ours = stats_from_delta(delta)
    assert ours.data == theirs.data
    assert ours.data["data"][S.TRANSFER_SECONDS.name][STORE] == [0.5, 0.25, 0.125]
    assert delta.observations == kept
