"""A long window (hours to weeks) through Prometheus: summarised, never sampled blind.

Prometheus decodes every sample a range query spans, whatever its step: seven days of a
512-rank engine are ~70 M samples, tens of seconds of a small Prometheus' CPU. Point
samples every ``window / 240`` would also miss what the classifiers need (a counter's
growth before a reset, a gauge's peak, a stuck transfer that lasted minutes). So a window
whose step would exceed :data:`RAW_STEP_MAX_S` is read as:

* ``start``: every series' raw value (one instant query; the counters' baseline);
* ``buckets``: the scheduler's series (no ``rank`` label: ~100 per engine) as
  ``max_over_time`` over :data:`~.prometheus.MAX_POINTS` equal buckets up to the tail, and
  gauges also ``min_over_time``: every peak and dip is kept (at its bucket's end), and a
  counter's bucket maximum keeps its growth across a reset;
* ``tail``: the last :data:`TAIL_S` seconds raw, every :data:`TAIL_STEP_S` seconds: last
  values and ``Quantity.recent`` ("still happening") come from real samples;
* the worker ranks' series (``rank`` label: ~13 per rank) raw at ``start``, at the tail's
  start and at ``end`` only: what is read of them is their growth, last value and presence,
  and those reads touch one chunk per series each, not seven days of them.

Which names exist in the window comes from the label-values index first (one cheap call):
nothing is queried for a name the window lacks. Bucket maxima and minima of
:data:`NAMES_PER_QUERY` names go in one query: about ten round trips in all, in parallel.
At most ``1 + 2 * MAX_POINTS + tail`` points per series (:func:`points_bound`).

The bucket queries go last: where the window holds so many series that ``MAX_POINTS``
buckets each would pass the sample cap (a fleet of engines read with ``--each-engine``),
the buckets are widened to what the cap leaves after the start, tail and worker answers
(:func:`fitted_points`), down to :data:`MIN_POINTS`, and the report's note says how wide:
a coarser timeline, every peak and dip still kept, instead of no verdict.
"""

from __future__ import annotations

import math
from collections import defaultdict

from kvscope.exporters import signals as S

from ..model import DiagnoseError, Series
from .limits import LimitExceeded, parallel_map
from .wanted import is_counter

RAW_STEP_MAX_S = 60.0  # up to 4 h (240 points at <= 60 s): raw points, every sample scraped once
TAIL_S = 300.0  # the recent span of a long window: the last five minutes, raw
TAIL_STEP_S = 15.0
NAMES_PER_QUERY = 12
MIN_POINTS = 24  # the fewest buckets a fleet's window is widened to (7 days: 7 h each)
FIT_MARGIN = 1.1  # series born inside the window, seen by neither the start nor the tail
WORKER_SERIES = frozenset(n for m in S.WORKER_METRICS for n in S.exposed_series(m))
# Read by no check (the per-rank transfer-time histograms: a third of a fleet engine's
# series): a long window leaves them out; a short one still reads every wanted name.
UNREAD = frozenset({f"{S.TRANSFER_SECONDS.name}_sum", f"{S.TRANSFER_SECONDS.name}_count"})


def is_long(start: float, end: float, step: float) -> bool:
    return step > RAW_STEP_MAX_S


def points_bound(max_points: int) -> int:
    """Most points one series can have in a long window's answer."""
    return 1 + 2 * max_points + int(TAIL_S // TAIL_STEP_S) + 1


def bucket_grid(start: float, end: float, max_points: int) -> tuple[float, float, float]:
    """(first bucket end, last bucket end, bucket seconds): ``max_points`` buckets cover
    [start, end - TAIL_S] exactly (ms resolution)."""
    edge = end - TAIL_S
    ms = max(1, math.ceil((edge - start) * 1000 / max_points))
    return edge - (max_points - 1) * ms / 1000, edge, ms / 1000


def fitted_points(max_points: int, room: int, bucket_series: int) -> int:
    """Buckets per series for ``bucket_series`` series (scheduler series' maxima plus
    gauges' minima) in ``room`` samples (the cap less what the window's other answers
    took): ``max_points`` where they fit, else fewer, never under :data:`MIN_POINTS`
    (then the cap refuses the answers as before). Each series costs one '[' of its own."""
    if bucket_series <= 0:
        return max_points
    fit = int((room - bucket_series) / (bucket_series * FIT_MARGIN))
    return max(MIN_POINTS, min(max_points, fit))


def note(start: float, end: float, max_points: int) -> str:
    """The report's note on how the window was read."""
    bucket = bucket_grid(start, end, max_points)[2]
    return (f"window of {(end - start) / 3600:.1f} h read summarised: {max_points} buckets of "
            f"{bucket / 60:.1f} min (each bucket's max, and min for gauges), the last "
            f"{TAIL_S / 60:.0f} min raw; worker ranks' series at the start, "
            f"{TAIL_S / 60:.0f} min before the end and the end")


def _regex(names) -> str:
    return "|".join(sorted(names))  # metric names hold no regex metacharacters


def _named(expr: str, name: str) -> str:
    return f'label_replace({expr}, "__name__", "{name}", "", "")'


def _sel(matchers: str, sel: str) -> str:
    return "{" + ",".join([matchers] + ([sel] if sel else [])) + "}"


class LongRead:
    """The queries of one long window and the series they give (see the module doc)."""

    def __init__(self, client, start: float, end: float, sel: str, names: dict[str, str],
                 max_points: int, parse):
        self.client, self.start, self.end, self.sel = client, start, end, sel
        # name as queried -> name kv-diagnose knows it by
        self.names = {q: n for q, n in names.items() if n not in UNREAD}
        self.max_points = max_points
        self.parse = parse  # (queried name, name, result, url) -> Series | None

    def present(self) -> dict[str, str]:
        """The queried names that have a series in the window (from the index); all of
        them where the server has no label-values API (a proxy that only passes queries)."""
        try:
            found = set(self.client.label_values("__name__", _sel(
                f'__name__=~"{_regex(self.names)}"', self.sel), self.start, self.end))
        except DiagnoseError:
            return dict(self.names)
        return {q: n for q, n in self.names.items() if q in found}

    def point_jobs(self, present: dict[str, str]) -> list[tuple[str, str, str]]:
        """(what, name as queried or "", PromQL): the start, tail and worker queries, each
        answered on its own."""
        workers = {q for q in present if present[q] in WORKER_SERIES}
        others = set(present) - workers
        out = [("start", "", _sel(f'__name__=~"{_regex(present)}"', self.sel))]
        if others:
            out.append(("tail", "", _sel(f'__name__=~"{_regex(others)}"', self.sel)))
        if workers:
            out.append(("ends", "", _sel(f'__name__=~"{_regex(workers)}"', self.sel)))
        return out

    def bucket_jobs(self, present: dict[str, str]) -> list[tuple[str, str, str]]:
        """The bucket queries, as :meth:`point_jobs`, over ``self.max_points`` buckets.

        Bucket maxima (and gauges' minima) of several names per query, each series named
        again with label_replace (a range function drops the name): a few round trips
        instead of one per name, URLs of a few KB."""
        others = sorted(q for q in present if present[q] not in WORKER_SERIES)
        bucket = bucket_grid(self.start, self.end, self.max_points)[2]
        rng = f"[{round(bucket * 1000)}ms]"
        out = []
        mins = [q for q in others if not is_counter(present[q])]
        for what, fn, qs in (("max", "max_over_time", others),
                             ("min", "min_over_time", mins)):
            for i in range(0, len(qs), NAMES_PER_QUERY):
                out.append((what, "", " or ".join(
                    _named(f"{fn}({_sel(f'__name__={q!r}', self.sel)}{rng})", q)
                    for q in qs[i:i + NAMES_PER_QUERY])))
        return out

    def fetch(self, job: tuple[str, str, str]) -> bytes:
        what, _, expr = job
        c, end = self.client, self.end
        if what == "start":
            return c.fetch_instant(expr, self.start)
        if what == "tail":
            return c.fetch_range(expr, end - TAIL_S + TAIL_STEP_S, end, TAIL_STEP_S)
        if what == "ends":
            return c.fetch_range(expr, end - TAIL_S, end, TAIL_S)
        first, last, bucket = bucket_grid(self.start, end, self.max_points)
        return c.fetch_range(expr, first, last, bucket)

    def series(self, job, body: bytes) -> list[tuple[str, str, Series]]:
        """(what, name as queried, Series) for each series of one answer."""
        what, queried, _ = job
        rows = (self.client.parse_instant(body) if what == "start"
                else self.client.parse_range(body))
        out = []
        for r in rows:
            q = queried or _name_of(r)
            if q in self.names and (s := self.parse(q, self.names[q], r, self.client.base)):
                out.append((what, q, s))
        return out


_WHAT = {"start": "values at the window's start", "tail": "last minutes' values",
         "ends": "worker ranks' latest values", "max": "bucket maxima", "min": "bucket minima"}


def _name_of(r) -> str:
    """A series' name from its labels; "" for a malformed one (skipped, as unknown)."""
    m = r.get("metric") if isinstance(r, dict) else None
    return str(m.get("__name__", "")) if isinstance(m, dict) else ""


def merge(parts: list, names: dict[str, str], bucket: float) -> list[Series]:
    """One Series per (name, labels) from every query's pieces; a name stored under both
    spellings (``vllm:x`` and ``vllm_x``) keeps the real one. A gauge's bucket minimum
    sits half a bucket before its maximum (both within the bucket), only where they differ."""
    pieces: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    meta: dict[tuple, tuple[str, str]] = {}
    for what, queried, s in parts:
        name = names[queried]
        key = (name, s.labels, queried)
        meta[key] = (name, s.target)
        pieces[key][what].extend(s.samples)
    spellings: dict[tuple, list[str]] = defaultdict(list)
    for name, labels, queried in pieces:
        spellings[(name, labels)].append(queried)
    out = []
    for (name, labels), qs in sorted(spellings.items()):
        q = name if name in qs else sorted(qs)[0]
        p = pieces[(name, labels, q)]
        hi = dict(p["max"])
        lows = [(t - bucket / 2, v) for t, v in p["min"] if v < hi.get(t, v)]
        samples = sorted(p["start"] + p["max"] + lows + p["tail"] + p["ends"])
        out.append(Series(name, labels, meta[(name, labels, q)][1], tuple(samples)))
    return out


def _bucket_series(seen: set[tuple[str, tuple]], present: dict[str, str]) -> int:
    """The series the bucket queries will return, from those the start, tail and worker
    answers brought ((name as queried, labels)): each non-worker series once for its
    maxima, a gauge's once more for its minima."""
    return sum(1 if is_counter(present[q]) else 2 for q, _ in seen
               if present[q] not in WORKER_SERIES)


def read(client, start: float, end: float, sel: str, names: dict[str, str], max_points: int,
         parse, deadline, keep, room) -> tuple[list[Series], list[str], int]:
    """The window's series, the queries that failed (one line each) and the buckets per
    series read. ``keep(body, parse_fn, fresh)`` counts an answer against the caps and
    parses it; ``room()``: the samples the cap still allows."""
    lr = LongRead(client, start, end, sel, names, max_points, parse)
    present = lr.present()
    if not present:
        return [], [], max_points

    seen: set[tuple[str, tuple]] = set()

    def fresh(parts) -> int:
        """Series new to the window: the series cap counts each once, not once an answer
        (called under ``keep``'s lock)."""
        new = {(q, s.labels) for _, q, s in parts} - seen
        seen.update(new)
        return len(new)

    def run(jobs):
        results = parallel_map(lambda j: keep(lr.fetch(j), lambda b: lr.series(j, b), fresh),
                               jobs, 8, deadline)
        fatal = next((r for r in results if isinstance(r, LimitExceeded)), None)
        if fatal is not None:
            raise fatal
        return results

    # the start, tail and worker answers first: their series say what the buckets cost
    jobs = lr.point_jobs(present)
    results = run(jobs)
    lr.max_points = fitted_points(max_points, room(), _bucket_series(seen, present))
    buckets = lr.bucket_jobs(present)
    jobs += buckets
    results += run(buckets)
    parts, failures = [], []
    first_error: DiagnoseError | None = None
    for job, r in zip(jobs, results, strict=True):
        if isinstance(r, DiagnoseError):
            failures.append(f"query for the {_WHAT[job[0]]} failed: {r}")
            first_error = first_error or r
        elif isinstance(r, BaseException):
            raise r
        else:
            parts += r
    if first_error is not None and len(failures) == len(jobs):
        raise first_error  # every query failed the same way: the selector, the server
    return (merge(parts, names, bucket_grid(start, end, lr.max_points)[2]), failures,
            lr.max_points)
