"""Build the typed evidence (:mod:`.model`) from any source's :class:`RawWindow`.

Three steps: keep the series kv-diagnose reads, clean and sorted
(:func:`_clean`); refuse a window without kvscope in it (:func:`_refuse`); fill
every field from the rows of :mod:`.read_table`. Classifiers read only
:class:`Evidence`; metric names come from :mod:`kvscope.exporters.signals`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from kvscope.exporters import signals as S

from ..model import DiagnoseError, Quantity, RawWindow, Series, SourceInfo
from ..sources.limits import MAX_LABEL_CHARS
from ..sources.wanted import WANTED_SERIES, is_counter
from . import partial
from . import read_table as T
from .model import (
    Evidence,
    Freshness,
    GroupLookups,
    Pending,
    RankTransfers,
    Requests,
    RestoreCoverage,
    Rounds,
    Tiers,
    Vllm,
)
from .quantities import aggregate, by_label
from .targets import (
    TargetInfo,
    read_kv_group_drafters,
    read_kv_group_restore_chunks,
    read_kv_groups,
    read_targets,
    scope_key,
)

__all__ = [
    "WANTED_SERIES", "Evidence", "Freshness", "GroupLookups", "Pending", "RankTransfers",
    "Requests", "RestoreCoverage", "Rounds", "TargetInfo", "Tiers", "Vllm", "aggregate",
    "build_evidence", "is_counter",
]

SeriesOf = Callable[[str], list[Series]]


@dataclass
class _Cleaned:
    by_name: dict[str, list[Series]] = field(default_factory=lambda: defaultdict(list))
    label_names: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    nonfinite: set[str] = field(default_factory=set)
    too_long: int = 0  # series dropped for an overlong label


def build_evidence(raw: RawWindow) -> Evidence:
    """Typed evidence from any source. Raises DiagnoseError when kvscope is absent."""
    src = raw.source
    c = _clean(raw)
    present = frozenset(c.by_name)
    _refuse(raw, present, c.nonfinite)

    def series_of(name: str) -> list[Series]:
        return c.by_name.get(name, [])

    targets = read_targets(series_of(S.INFO.name))
    # the exporter that labels world_size also presets the latest-round gauges (partial.py)
    read = _reader(src, _first_seen(c.by_name), any(t.world_size for t in targets))
    kv_groups = read_kv_groups(series_of(S.KV_GROUP_INFO.name))
    steps_cls, steps_rows = T.FRESHNESS
    last_step: dict[str, list[Series]] = defaultdict(list)
    for s in series_of(T.LAST_STEP.name):
        last_step[_target_key(s)].append(s)
    notes = raw.notes + ((
        f"{c.too_long} series dropped: a label value longer than {MAX_LABEL_CHARS} characters "
        "(kvscope's labels are short; a relabel rule or another exporter made these)",)
        if c.too_long else ())
    return Evidence(
        source=src,
        targets=targets,
        kv_groups=kv_groups,
        kv_group_drafters=read_kv_group_drafters(series_of(S.KV_GROUP_INFO.name)),
        kv_group_restore_chunks=read_kv_group_restore_chunks(series_of(S.KV_GROUP_INFO.name)),
        lookups=_split(T.LOOKUPS, series_of, read, extra_keys=kv_groups),
        ranks=_split(T.RANKS, series_of, read),
        freshness=steps_cls(
            **_fill(steps_rows, series_of, read),
            last_step={t: read(T.LAST_STEP, ss) for t, ss in sorted(last_step.items())},
            now=src.now,
        ),
        **{name: cls(**_fill(rows, series_of, read)) for name, (cls, rows) in T.PARTS.items()},
        **_fill(T.FIELDS, series_of, read),
        rank_scopes=_rank_scopes(c.by_name),
        present=present,
        label_names={k: frozenset(v) for k, v in c.label_names.items()},
        nonfinite=frozenset(c.nonfinite),
        failures=raw.failures,
        notes=notes,
    )


def _reader(src: SourceInfo, first_seen: dict[str, float], world_size_known: bool):
    """``read(row, series)``: one evidence field from its series, as the row says.
    ``others_present``: the row's series exist for another part of a split."""
    def read(row: T.Read, series: list[Series],
             others_present: bool = False) -> Quantity | dict[str, Quantity]:
        if row.by:
            return partial.label_values(by_label(series, row.by, src, row.how, first_seen),
                                        row.name, row.by, others_present, world_size_known)
        return aggregate(series, src, row.how, first_seen)
    return read


def _fill(rows: dict[str, T.Read], series_of: SeriesOf, read,
          present: frozenset[str] = frozenset()) -> dict:
    return {f: read(row, series_of(row.name), row.name in present) for f, row in rows.items()}


def _split(split: T.Split, series_of: SeriesOf, read, extra_keys=()) -> dict:
    """One ``split.part`` per value of ``split.label`` (plus ``extra_keys``), natural order."""
    parts: dict[str, dict[str, list[Series]]] = defaultdict(lambda: defaultdict(list))
    for row in split.rows.values():
        for s in series_of(row.name):
            parts[s.label(split.label)][row.name].append(s)
    keys = sorted(set(parts) | set(extra_keys), key=_natural)
    # A KV group the engine lists (extra_keys), or a worker rank other series name, without
    # series the other groups or ranks have: its values were dropped, not never exported.
    present = frozenset(n for k, ss in parts.items() if k not in split.exempt for n in ss)
    return {k: split.part(**{split.key: k}, **_fill(
                split.rows, parts[k].__getitem__, read,
                frozenset() if k in split.exempt else present))
            for k in keys}


_WORKER_SERIES = tuple(n for m in S.WORKER_METRICS for n in S.exposed_series(m))


def _rank_scopes(by_name: dict[str, list[Series]]) -> dict[tuple[str, str, str], frozenset[str]]:
    """Worker ranks per engine (vLLM's /metrics labels them; a standalone exporter does not)."""
    scopes: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for name in _WORKER_SERIES:
        for s in by_name.get(name, ()):
            rank = s.label(S.L_RANK)
            if rank == S.RANK_MANAGER:
                continue
            engine = s.label(S.VLLM_LABEL_ENGINE)
            key = (s.target, s.label(S.VLLM_LABEL_MODEL), engine) if engine else ("", "", "")
            scopes[key].add(rank)
    return {k: frozenset(v) for k, v in scopes.items()}


def _clean(raw: RawWindow) -> _Cleaned:
    """The series kv-diagnose reads, finite and in time order; overlong labels dropped."""
    c = _Cleaned()
    for s in raw.series:
        if s.name not in WANTED_SERIES:
            continue
        if len(s.target) > MAX_LABEL_CHARS or any(
                len(k) > MAX_LABEL_CHARS or len(v) > MAX_LABEL_CHARS for k, v in s.labels):
            c.too_long += 1
            continue
        s = _finite(s, c.nonfinite)
        if s.samples:
            c.by_name[s.name].append(s)
            c.label_names[s.name].update(k for k, _ in s.labels)
    return c


def _refuse(raw: RawWindow, present: frozenset[str], nonfinite: set[str]) -> None:
    """DiagnoseError unless some kvscope series is in the window."""
    if any(n.startswith(S.PREFIX) for n in present):
        return
    src = raw.source
    also = f" (and {'; '.join(raw.failures)})" if raw.failures else ""
    bad = f"; non-finite values in {', '.join(sorted(nonfinite))}" if nonfinite else ""
    if present:
        raise DiagnoseError(
            f"no kvscope metrics at {src.location} (only vLLM's own): is kvscope's "
            f"ObservedOffloadingConnector installed on that engine?{bad}{also}"
        )
    raise DiagnoseError(
        f"no kvscope or vLLM metrics at {src.location}"
        + (f" for selector {src.selector}" if src.selector else "")
        + f" in the window: wrong target, empty window, or kvscope not installed{bad}{also}"
    )


def _first_seen(by_name: dict[str, list[Series]]) -> dict[str, float]:
    """When each target was first sampled: a counter there from that moment on
    has history from before the window; one that shows up later was born in it."""
    fs: dict[str, float] = {}
    for ss in by_name.values():
        for s in ss:
            t = s.samples[0][0]
            if t < fs.get(s.target, math.inf):
                fs[s.target] = t
    return fs


def _finite(s: Series, nonfinite: set[str]) -> Series:
    """``s`` without NaN/±Inf samples, in time order. A non-finite value is no
    number to judge by: the series is named in ``nonfinite`` and the checks that
    need it report it instead of reading it as zero (or as a pass)."""
    if not s.samples:
        return s
    ts, vs = zip(*s.samples)
    # Fast path (C loops): a finite sum means every value is finite (a huge
    # finite sum that overflows only sends it down the exact path below).
    if math.isfinite(sum(vs)) and math.isfinite(sum(ts)):
        if list(ts) == sorted(ts):
            return s
        return Series(s.name, s.labels, s.target, tuple(sorted(s.samples, key=lambda p: p[0])))
    ok = [(t, v) for t, v in s.samples if math.isfinite(t) and math.isfinite(v)]
    if len(ok) != len(s.samples):
        nonfinite.add(s.name)
    ok.sort(key=lambda p: p[0])
    return Series(s.name, s.labels, s.target, tuple(ok))


def _target_key(s: Series) -> str:
    return scope_key(s.target, s.label(S.VLLM_LABEL_MODEL), s.label(S.VLLM_LABEL_ENGINE))


def _natural(key: str):
    return (0, int(key), "") if key.isdigit() else (1, math.inf, key)
