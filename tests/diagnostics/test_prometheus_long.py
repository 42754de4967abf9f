"""A long window (7 days) through a real Prometheus holding a backfilled TSDB (promtool).

The step rule: a window longer than four hours is read summarised (``prometheus_long``);
every series comes back in a bounded number of points, and what the classifiers need from
seven days (a counter's growth across a reset, a three-minute gauge peak, an eight-minute
stuck transfer) is still there.
"""

from __future__ import annotations

import json
import math
import re
import time

import pytest

from kvscope.diagnostics import cli
from kvscope.diagnostics.evidence.quantities import aggregate
from kvscope.diagnostics.model import SourceInfo
from kvscope.diagnostics.sources import prometheus
from kvscope.diagnostics.sources.prometheus import MAX_POINTS, prometheus_window, step_for
from kvscope.diagnostics.sources.prometheus_long import (
    MIN_POINTS,
    TAIL_S,
    UNREAD,
    WORKER_SERIES,
    bucket_grid,
    fitted_points,
    is_long,
    points_bound,
)
from kvscope.exporters import signals as S
from tests.support.backfill import backfill
from tests.support.fleet_history import EXPECTED, History, Shape, chunks, write_chunk
from tests.support.prometheus import require_binaries, running_prometheus

pytestmark = pytest.mark.prometheus

WEEK = 7 * 86400
FLEET = "fleet-engine-0:8000"  # the small engine's instance
HAND = "handmade:9400"  # the hand-made series' instance
FLEET_SEL, HAND_SEL = f'{{instance="{FLEET}"}}', f'{{instance="{HAND}"}}'
RESET_AT = 4 * 86400  # seconds after the window start: the hand-made process restarts
PEAK_AT = 2.5 * 86400  # a three-minute peak of the age gauge
STEPS_PER_S = 10


def test_step_rule():
    assert not is_long(0, 4 * 3600, step_for(0, 4 * 3600))  # 60 s points: raw, as before
    assert is_long(0, 4 * 3600 + 300, step_for(0, 4 * 3600 + 300))
    first, last, bucket = bucket_grid(0, WEEK, MAX_POINTS)
    assert last == WEEK - TAIL_S
    assert round((last - first) / bucket) + 1 == MAX_POINTS  # MAX_POINTS buckets ...
    assert first - bucket <= 1e-3 and first > 0  # ... that start at the window's start
    assert points_bound(MAX_POINTS) <= 2 * MAX_POINTS + 30


def _handmade(end: float):
    """(name, labels, fn) of three series an hour of history before the week to ``end``."""
    t_reset = end - WEEK + RESET_AT
    t_peak = math.floor((end - WEEK + PEAK_AT) / 60) * 60  # sampled at ages 60, 120, 180

    def steps(t):
        return STEPS_PER_S * (t - (t_reset if t >= t_reset else end - WEEK - 3600))

    def age(t):
        a = t - t_peak
        return a if 0 < a <= 180 else 0.0

    base = {"instance": HAND, "job": "hand"}
    return [
        (S.SCHEDULER_STEPS.name, base, steps),
        (S.OLDEST_PENDING_TRANSFER.name, {**base, "kind": "load"}, age),
        (S.TRANSFER_BYTES.name, {**base, "rank": "0", "direction": "gpu_to_cpu"},
         lambda t: 4096 * (t - end + WEEK + 3600)),
    ]


def _write_handmade(series, lo: float, hi: float, path, interval: int = 60) -> int:
    ts = range(math.ceil(lo / interval) * interval, math.ceil(hi), interval)
    n = 0
    with open(path, "a") as f:  # appended to the fleet's chunk: one promtool run per day
        for name, labels, fn in series:
            lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            f.write("".join(f"{name}{{{lab}}} {int(fn(t))} {t}\n" for t in ts))
            n += len(ts)
        f.write("# EOF\n")
    return n


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    """A Prometheus holding a week (and a bit) of a 2-rank fleet engine every 120 s, and
    the hand-made series every 60 s; yields (url, end)."""
    require_binaries()
    work = tmp_path_factory.mktemp("week")
    end = float(int(time.time()) + 900)  # the runs below ask for windows ending now
    shape = Shape(end=end, span=WEEK + 1800, interval=120, world_size=2, instance=FLEET)
    history, hand = History(shape), _handmade(end)

    def write(lo, hi, path):
        return write_chunk(history, lo, hi, path, eof=False) + _write_handmade(hand, lo, hi, path)

    backfill(chunks(shape), write, work / "data", work)
    with running_prometheus([], workdir=work, retention="30d", timeout=60) as prom:
        prom.wait_for(f"{S.SCHEDULER_STEPS.name} offset 7d", timeout=60)
        yield prom.url, end


def test_a_week_comes_back_in_bounded_points(week):
    url, _ = week
    end = time.time()
    raw = prometheus_window(url, end - WEEK, end, FLEET_SEL, timeout=30)
    assert raw.source.recent_span == TAIL_S
    # every series of the engine but the transfer-time histograms no check reads
    built = [n for n, _, _ in History(Shape(end, WEEK, world_size=2)).series()]
    assert len(raw.series) == sum(1 for n in built if n not in UNREAD)
    assert UNREAD & set(built) and not UNREAD & {s.name for s in raw.series}
    bound = points_bound(MAX_POINTS)
    for s in raw.series:
        assert 2 <= len(s.samples) <= bound, (s.name, len(s.samples))
        if s.name in WORKER_SERIES:  # at start, at the tail's start, at the end
            assert len(s.samples) == 3, (s.name, s.labels, s.samples)


def test_reset_and_short_peak_survive_the_summary(week):
    url, hist_end = week
    end = time.time()
    start = end - WEEK
    names = frozenset({S.SCHEDULER_STEPS.name, S.OLDEST_PENDING_TRANSFER.name,
                       S.TRANSFER_BYTES.name})
    raw = prometheus_window(url, start, end, HAND_SEL, timeout=30, names=names)
    by = {s.name: s for s in raw.series}
    src: SourceInfo = raw.source
    # steps: the growth up to the restart plus the new process' count since
    steps = aggregate([by[S.SCHEDULER_STEPS.name]], src)
    t_reset = hist_end - WEEK + RESET_AT  # the history's clock (see _handmade)
    last_before_reset = math.floor((t_reset - 1) / 60) * 60
    first_in = math.floor(start / 60) * 60
    last_in = math.floor(end / 60) * 60
    exact = STEPS_PER_S * (last_before_reset - first_in) + STEPS_PER_S * (last_in - t_reset)
    assert steps.increase == pytest.approx(exact, abs=STEPS_PER_S * 60)
    # the three-minute age peak, days before the end, at its full height; last value raw
    age = aggregate([by[S.OLDEST_PENDING_TRANSFER.name]], src, "max")
    assert age.max == 180 and age.last == 0
    # a worker series: its growth over the window from three points
    moved = aggregate([by[S.TRANSFER_BYTES.name]], src)
    assert moved.increase == pytest.approx(4096 * (last_in - first_in), rel=1e-6)
    assert len(by[S.TRANSFER_BYTES.name].samples) == 3


def _finds_the_incidents(url: str, capsys) -> None:
    """``kv-diagnose --since 7d`` on the fleet engine reports both incidents built in."""
    # scraped every 120 s here: a step timestamp up to 120 s old is not stale
    code = cli.main(["--prometheus", url, "--since", "7d", "--selector", FLEET_SEL,
                     "--stale-after", "5m", "--json"])
    doc = json.loads(capsys.readouterr().out)
    found = {v["id"]: v for v in doc["verdicts"]}
    assert code == 1 and set(EXPECTED) <= set(found), list(found)
    # the eight-minute stuck load transfer, 3.4 days back (sampled every 120 s: 6-8 min)
    assert any(s["kind"] == "load" and 5.5 * 60 <= s["pending_s"] <= 8.5 * 60  # 6-8 min
               for s in found["unclassified_anomaly"]["facts"]["stuck_transfers"]), found


def test_kv_diagnose_since_7d_finds_the_incidents(week, capsys):
    _finds_the_incidents(week[0], capsys)


def test_buckets_fitted_to_the_sample_cap():
    assert fitted_points(MAX_POINTS, 600_000, 300) == MAX_POINTS  # one engine: fits
    # 64 engines x ~100 scheduler series, a third of them gauges (minima too): ~49 buckets
    n = 64 * 130
    fit = fitted_points(MAX_POINTS, 440_000, n)
    assert MIN_POINTS < fit < MAX_POINTS and n + fit * n * 1.1 <= 440_000
    assert fitted_points(MAX_POINTS, 10_000, 20_000) == MIN_POINTS  # the cap refuses it then
    assert fitted_points(MAX_POINTS, 100, 0) == MAX_POINTS


def test_a_window_over_the_sample_cap_is_read_in_wider_buckets(week, capsys, monkeypatch):
    """Where MAX_POINTS buckets of every series would pass the sample cap (a fleet read
    with --each-engine: 64 engines x TP=8 over 7 days is ~2.3 M samples against 600,000),
    the buckets widen to what the cap leaves: the same incidents are found, in fewer
    samples than the cap, and the report says how wide the buckets were."""
    url, _ = week
    end = time.time()
    full = prometheus_window(url, end - WEEK, end, FLEET_SEL, timeout=30)
    cap = sum(len(s.samples) for s in full.series) // 3  # 240 buckets would not fit
    monkeypatch.setattr(prometheus, "MAX_SAMPLES", cap)
    # the keeper's slack over the sample cap (a '[' per series) scaled down with it
    monkeypatch.setattr(prometheus, "MAX_SERIES", 8 * len(full.series))
    narrow = prometheus_window(url, end - WEEK, end, FLEET_SEL, timeout=30)
    assert {(s.name, s.labels) for s in narrow.series} == {(s.name, s.labels)
                                                            for s in full.series}
    assert sum(len(s.samples) for s in narrow.series) <= cap
    buckets = int(re.search(r"read summarised: (\d+) buckets", " ".join(narrow.notes))[1])
    assert MIN_POINTS <= buckets < MAX_POINTS
    _finds_the_incidents(url, capsys)


def test_the_series_cap_counts_each_series_once(week, monkeypatch):
    """A long window's answers each bring a series back (its start, its tail or ends, its
    bucket maxima and minima): the series cap counts it once, so a window of as many
    series as the cap allows is read whole (64 engines x TP=8: ~12,000 series, ~34,000
    counted per answer against 20,000)."""
    url, _ = week
    end = time.time()
    full = prometheus_window(url, end - WEEK, end, FLEET_SEL, timeout=30)
    monkeypatch.setattr(prometheus, "MAX_SERIES", len(full.series))
    again = prometheus_window(url, end - WEEK, end, FLEET_SEL, timeout=30)
    assert {(s.name, s.labels) for s in again.series} == {(s.name, s.labels)
                                                           for s in full.series}
