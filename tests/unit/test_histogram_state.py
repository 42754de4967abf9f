"""A histogram's batch of observations lands as each one alone would (buckets, count, sum)."""

import math
import random
from bisect import bisect_left

from kvscope.exporters.recorder import HistogramState

BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0)


def one_at_a_time(values):
    """The definition: each value into the first bucket whose bound is >= it (a NaN: +Inf),
    the sum added in order."""
    counts, total = [0] * (len(BUCKETS) + 1), 0.0
    for v in values:
        counts[bisect_left(BUCKETS, v) if not math.isnan(v) else len(BUCKETS)] += 1
        total += v
    return counts, total


def test_a_batch_lands_as_its_values_one_at_a_time():
    rng = random.Random(7)
    values = [rng.lognormvariate(-3, 2) for _ in range(5000)] + list(BUCKETS) + [0.0, 1e9]
    rng.shuffle(values)
    state = HistogramState(BUCKETS)
    state.observe_many(values[:1234])
    state.observe_many(values[1234:])
    counts, total = one_at_a_time(values)
    assert state.counts == counts
    assert state.total == total  # the same additions in the same order: equal, not close
    assert state.count == len(values)


def test_a_nan_counts_in_the_last_bucket_and_the_others_where_they_fall():
    values = [0.05, float("nan"), 2.0, float("inf")]
    state = HistogramState(BUCKETS)
    state.observe_many(values)
    assert state.counts == [0, 0, 1, 0, 0, 1, 2]
    assert math.isnan(state.total) and state.count == 4


def test_an_empty_batch_changes_nothing():
    state = HistogramState(BUCKETS)
    state.observe_many([])
    assert (state.counts, state.total, state.count) == ([0] * 7, 0.0, 0)
