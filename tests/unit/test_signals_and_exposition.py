"""The signal contract and its exposition (no vLLM needed).

The golden file is the reviewed list of every series kvscope exports, and the
input of ``promtool check metrics`` (node_exporter's checkmetrics habit).
Regenerate after an intended contract change with
``KVSCOPE_UPDATE_GOLDEN=1 pytest tests/unit/test_signals_and_exposition.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.exporters import signals as S
from kvscope.exporters.prometheus import RecorderCollector, start_exporter
from kvscope.exporters.recorder import Recorder

GOLDEN = Path(__file__).parent / "fixtures" / "metrics.golden.txt"


def _sample_labels(m: S.Metric) -> tuple[str, ...]:
    values = []
    for label in m.labels:
        closed = m.label_values.get(label)
        values.append(closed[0] if closed else {"kv_group": "0", "rank": "0"}.get(label, "x"))
    return tuple(values)


def _populated() -> Recorder:
    rec = Recorder()
    for i, m in enumerate(S.ALL_METRICS, start=1):
        labels = _sample_labels(m)
        if m.kind is S.Kind.COUNTER:
            rec.inc(m, labels, i)
        elif m.kind is S.Kind.GAUGE:
            rec.set(m, labels, i)
        else:
            for v in (m.buckets or (1,))[:3]:
                rec.observe(m, labels, v)
    rec.flush()
    return rec


def _exposition(rec: Recorder) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RecorderCollector(rec))
    return generate_latest(reg).decode()


def test_contract_is_consistent():
    names = [m.name for m in S.ALL_METRICS]
    assert len(names) == len(set(names))
    for m in S.ALL_METRICS:
        assert re.fullmatch(r"kvscope_[a-z0-9_]+", m.name), m.name
        assert m.name.endswith("_total") == (m.kind is S.Kind.COUNTER), m.name
        assert set(m.label_values) <= set(m.labels), m.name
        assert not {"request_id", "req_id", "block_hash", "key"} & set(m.labels)
        if m.kind is S.Kind.HISTOGRAM:
            assert m.buckets and list(m.buckets) == sorted(m.buckets)
    assert set(S.BY_NAME) == set(names)


def test_golden_exposition():
    text = _exposition(_populated())
    if os.environ.get("KVSCOPE_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    exported = {fam.name for fam in text_string_to_metric_families(text)}
    assert exported == {m.base for m in S.ALL_METRICS}


@pytest.mark.prometheus
def test_golden_passes_promtool_check_metrics():
    if not shutil.which("promtool"):
        pytest.skip("Debian prometheus (promtool) not installed")
    proc = subprocess.run(["promtool", "check", "metrics"], input=GOLDEN.read_text(),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_recorder_delta_and_snapshot():
    rec = Recorder()
    rec.inc(S.SCHEDULER_STEPS)
    rec.set(S.PRIMARY_ROWS, ("total",), 4)
    rec.observe(S.ROUND_PENDING_KEYS, (), 4)
    assert rec.value(S.SCHEDULER_STEPS) == 0  # nothing visible before the step's flush
    rec.flush()
    rec.inc(S.SCHEDULER_STEPS)
    rec.flush()
    assert rec.value(S.SCHEDULER_STEPS) == 2
    delta = rec.take_delta()
    assert delta.counters[(S.SCHEDULER_STEPS, ())] == 2
    assert delta.gauges[(S.PRIMARY_ROWS, ("total",))] == 4
    assert delta.observations[(S.ROUND_PENDING_KEYS, ())] == [4]
    assert rec.take_delta().is_empty()
    hist = rec.snapshot().histograms[(S.ROUND_PENDING_KEYS, ())]
    assert hist.count == 1 and hist.total == 4
    assert hist.counts[S.PENDING_KEY_BUCKETS.index(4)] == 1


def test_threadsafe_writes_reach_scrapes_and_the_stats_delta_at_once():
    """A probe thread's writes: visible without a flush (an idle engine takes no steps),
    in the delta vLLM's stats path takes next, and never lost to a concurrent flush."""
    import threading

    rec = Recorder()
    rec.inc_threadsafe(S.TIER_LOST_KEYS, ("fs",), 3)
    rec.set_threadsafe(S.TIER_ROOT_PRESENT, ("fs",), 0)
    assert rec.value(S.TIER_LOST_KEYS, ("fs",)) == 3
    assert rec.value(S.TIER_ROOT_PRESENT, ("fs",)) == 0
    delta = rec.take_delta()
    assert delta.counters[(S.TIER_LOST_KEYS, ("fs",))] == 3
    assert delta.gauges[(S.TIER_ROOT_PRESENT, ("fs",))] == 0
    stop = threading.Event()

    def steps():  # the scheduler thread: its own counter, flushed per step
        while not stop.is_set():
            rec.inc(S.SCHEDULER_STEPS)
            rec.flush()

    t = threading.Thread(target=steps)
    t.start()
    for _ in range(20_000):
        rec.inc_threadsafe(S.TIER_LOST_KEYS, ("fs",))
    stop.set()
    t.join()
    assert rec.value(S.TIER_LOST_KEYS, ("fs",)) == 20_003


def test_guard_counts_and_swallows():
    rec = Recorder()
    with rec.guard(S.ErrorSite.LOOKUP):
        raise RuntimeError("boom")
    with rec.guard(S.ErrorSite.LOOKUP):
        raise KeyError("again")
    rec.flush()
    assert rec.value(S.TELEMETRY_ERRORS, ("lookup",)) == 2


def test_declared_series_exist_at_zero():
    rec = Recorder()
    rec.declare(S.LOOKUP_ROUNDS, *[(v.value,) for v in S.Verdict])
    rec.flush()
    fams = {f.name: f for f in text_string_to_metric_families(_exposition(rec))}
    samples = [s for s in fams[S.LOOKUP_ROUNDS.base].samples if s.name == S.LOOKUP_ROUNDS.name]
    assert sorted(s.labels["verdict"] for s in samples) == sorted(v.value for v in S.Verdict)
    assert all(s.value == 0 for s in samples)


def test_standalone_exporter_binds_loopback_and_serves():
    import urllib.request

    rec = _populated()
    exp = start_exporter(rec, 0)
    try:
        assert exp.addr == "127.0.0.1"
        with urllib.request.urlopen(exp.url, timeout=5) as resp:
            body = resp.read().decode()
        assert S.LOOKUP_ROUNDS.name in body
    finally:
        exp.close()


def test_several_recorders_merge_into_one_series_each():
    a, b = Recorder(), Recorder()
    for rec in (a, b):
        rec.inc(S.SCHEDULER_STEPS)
        rec.observe(S.ROUND_PENDING_KEYS, (), 4)
        rec.flush()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RecorderCollector([a, b]))
    text = generate_latest(reg).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    counts = [s for s in fams[S.ROUND_PENDING_KEYS.name].samples
              if s.name == S.ROUND_PENDING_KEYS.name + "_count"]
    assert [s.value for s in counts] == [2]
    steps = [s for s in fams[S.SCHEDULER_STEPS.base].samples if s.name == S.SCHEDULER_STEPS.name]
    assert [s.value for s in steps] == [2]


def test_untaken_delta_stays_bounded_while_the_histogram_stays_exact():
    from kvscope.exporters.recorder import MAX_DELTA_OBSERVATIONS

    rec = Recorder()
    for _ in range(3):
        for _ in range(MAX_DELTA_OBSERVATIONS):
            rec.observe(S.ROUND_PENDING_KEYS, (), 1)
        rec.flush()
    assert len(rec.take_delta().observations[(S.ROUND_PENDING_KEYS, ())]) == \
        MAX_DELTA_OBSERVATIONS
    assert rec.value(S.ROUND_PENDING_KEYS) == 3 * MAX_DELTA_OBSERVATIONS
