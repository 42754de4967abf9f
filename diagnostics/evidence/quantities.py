"""Series -> :class:`Quantity`: reset-aware growth, and sums or maxima over series.

A source hands kv-diagnose plain timestamped series; every evidence field is one
:func:`aggregate` (or :func:`by_label`) of some of them.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable

from ..model import ABSENT, Quantity, Series, SourceInfo
from ..sources.wanted import is_counter


def _step_values(samples, times: list[float]) -> list[float]:
    """The series as a step function evaluated at ``times`` (0 before its first sample)."""
    ts = [t for t, _ in samples]
    out = []
    for t in times:
        i = bisect.bisect_right(ts, t + 1e-9) - 1
        out.append(samples[i][1] if i >= 0 else 0.0)
    return out


def counter_growth(samples, counts_from_zero: bool) -> float:
    """Growth of a counter over ``samples``; a drop is a reset. ``counts_from_zero``:
    the first value is growth too (the counter was born inside the span)."""
    if not samples:
        return 0.0
    growth = samples[0][1] if counts_from_zero else 0.0
    prev = samples[0][1]
    for _, v in samples[1:]:
        growth += v - prev if v >= prev else v  # a drop is a counter reset
        prev = v
    return growth


def _series_quantity(
    s: Series, src: SourceInfo, counter: bool, target_first: float | None = None
) -> tuple[float, float, float, float]:
    """(first, last, increase, recent) of one series.

    ``target_first`` is when the series' target was first sampled in the window.
    A counter that appears later than its target was created while the target
    was watched: its first value is growth, recent growth if it appeared inside
    the recent span. A counter present from the target's first sample on has an
    unknown history before it: that value counts towards ``increase`` (a target
    first seen inside the window is taken as started inside it; for a scrape,
    counters are lifetime totals) but never towards ``recent`` - a Prometheus
    that started scraping an old process must not make its old totals look like
    "still happening".
    """
    smp = s.samples
    first, last = smp[0][1], smp[-1][1]
    recent_from = src.end - src.recent_span
    recent_smp = [p for p in smp if p[0] >= recent_from - 1e-9]
    before = [p for p in smp if p[0] < recent_from - 1e-9]
    if before:
        recent_smp = [before[-1]] + recent_smp
    if counter:
        # Prometheus stamps samples in milliseconds: a window start with microseconds
        # (--since 30m) lies up to 1 ms before the first sample at it
        tol = 1e-3
        born = src.start if target_first is None else max(src.start, target_first)
        increase = counter_growth(smp, src.lifetime or smp[0][0] > src.start + tol)
        recent_from_zero = not before and smp[0][0] > max(recent_from, born) + tol
        recent = counter_growth(recent_smp, recent_from_zero)
    else:
        increase = last - first
        recent = recent_smp[-1][1] - recent_smp[0][1] if recent_smp else 0.0
    return first, last, increase, recent


def aggregate(
    series: Iterable[Series], src: SourceInfo, how: str = "sum",
    first_seen: dict[str, float] | None = None,
) -> Quantity:
    """Sum (or max, or min) series into one Quantity; per-series reset handling first.

    ``first_seen``: target -> its first sample time in the window (see
    :func:`_series_quantity`); without it, the window start.
    """
    series = [s for s in series if s.samples]
    if not series:
        return ABSENT
    counter = is_counter(series[0].name)
    fs = first_seen or {}
    parts = [_series_quantity(s, src, counter, fs.get(s.target)) for s in series]
    if len(series) == 1:  # one rank's, one label value's: its samples are the timeline
        timeline = tuple((t, float(v)) for t, v in series[0].samples)
    else:
        times = sorted({t for s in series for t, _ in s.samples})
        combine: Callable[[Iterable[float]], float] = {"sum": sum, "min": min}.get(how, max)
        columns = [_step_values(s.samples, times) for s in series]
        timeline = tuple((t, float(combine(vals)))
                         for t, vals in zip(times, zip(*columns, strict=True), strict=True))
    values = [v for _, v in timeline]
    if how == "sum":
        first, last, inc, rec = (float(sum(p[i] for p in parts)) for i in range(4))
    else:
        first, last = values[0], values[-1]
        inc, rec = max(p[2] for p in parts), max(p[3] for p in parts)
    return Quantity(
        first=first,
        last=last,
        increase=inc,
        recent=rec,
        min=min(values),
        max=max(values),
        samples=timeline,
        present=True,
    )


def by_label(
    series: list[Series], label: str, src: SourceInfo, how: str = "sum",
    first_seen: dict[str, float] | None = None,
) -> dict[str, Quantity]:
    """One :func:`aggregate` per value of ``label``, in value order."""
    groups: dict[str, list[Series]] = defaultdict(list)
    for s in series:
        groups[s.label(label)].append(s)
    return {k: aggregate(v, src, how, first_seen) for k, v in sorted(groups.items())}
