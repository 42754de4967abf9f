"""The typed evidence model: what kv-diagnose knows about one incident window.

:func:`build_evidence` turns a :class:`RawWindow` (any source) into
:class:`Evidence`; classifiers read only ``Evidence``. Metric names come from
:mod:`kvscope.exporters.signals` and nowhere else.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvscope.exporters import signals as S

from .limits import MAX_LABEL_CHARS
from .model import ABSENT, DiagnoseError, Quantity, RawWindow, Series, SourceInfo

# --------------------------------------------------------------------------
# Which series the classifiers need (the only ones a bundle keeps)
# --------------------------------------------------------------------------
VLLM_GAUGES = (
    S.VLLM_REQUESTS_RUNNING,
    S.VLLM_REQUESTS_WAITING,
    S.VLLM_REQUESTS_WAITING_BY_REASON,
)
VLLM_COUNTERS = (
    S.VLLM_EXTERNAL_PREFIX_QUERIES,
    S.VLLM_EXTERNAL_PREFIX_HITS,
    S.VLLM_OFFLOAD_LOAD_BYTES,
    S.VLLM_OFFLOAD_STORE_BYTES,
    S.VLLM_REQUEST_QUEUE_TIME + "_sum",
    S.VLLM_REQUEST_QUEUE_TIME + "_count",
)
# Histograms: only _sum/_count are read (buckets are never needed for a verdict).
KVSCOPE_SERIES = tuple(
    name
    for m in S.ALL_METRICS
    for name in (
        (m.name + "_sum", m.name + "_count") if m.kind is S.Kind.HISTOGRAM else (m.name,)
    )
)
WANTED_SERIES: frozenset[str] = frozenset(KVSCOPE_SERIES + VLLM_GAUGES + VLLM_COUNTERS
                                          + S.VLLM_NATIVE_OFFLOAD_SERIES)  # native.py
COUNTER_SERIES: frozenset[str] = frozenset(
    [m.name for m in S.ALL_METRICS if m.kind is S.Kind.COUNTER]
    + [n for n in KVSCOPE_SERIES if n.endswith(("_sum", "_count"))]
    + list(VLLM_COUNTERS)
)


def is_counter(name: str) -> bool:
    return name in COUNTER_SERIES


# --------------------------------------------------------------------------
# Evidence dataclasses
# --------------------------------------------------------------------------
def _q(d: dict[str, Quantity], key: str) -> Quantity:
    return d.get(key, ABSENT)


@dataclass(frozen=True)
class TargetInfo:
    """One scraped process (scheduler side), from ``kvscope_info``."""

    target: str
    model_name: str
    engine: str
    kvscope_version: str
    vllm_version: str
    spec: str
    tiers: str
    primary_rows: str
    hash_seeds: tuple[str, ...]  # distinct values, in order of first appearance
    checksum_policy: str = ""  # policy in effect (kvscope_info), "" when not exported
    chunk_tokens: str = ""  # tokens per offloaded chunk (one row per KV group)
    max_num_batched_tokens: str = ""
    # True when the seeds were first seen at different times (a restart seen
    # happening); False when all were already there at the first sample.
    seeds_ordered: bool = False

    def int_label(self, name: str) -> int | None:
        v = getattr(self, name)
        try:
            return int(float(v)) if v != "" else None
        except ValueError:
            return None


@dataclass(frozen=True)
class GroupLookups:
    group: str
    results: dict[str, Quantity]  # LookupResult value -> lookups

    def get(self, result: S.LookupResult) -> Quantity:
        return _q(self.results, result.value)

    @property
    def found(self) -> float:
        """Keys this group found in the primary tier (hit, hit_pending) over the window.

        ``retry`` is not "found": the tiering manager answers it both when a
        promotion started (found on disk) and while a secondary tier's
        asynchronous lookup is still running (not known yet). Keys found on
        disk show up as promotions (:attr:`Evidence.found_anywhere`).
        """
        return self.get(S.LookupResult.HIT).increase + self.get(S.LookupResult.HIT_PENDING).increase

    @property
    def total(self) -> float:
        return sum(q.increase for q in self.results.values())


@dataclass(frozen=True)
class Rounds:
    verdicts: dict[str, Quantity]  # Verdict value -> rounds
    at_ceiling: dict[str, Quantity]  # vetoed|deferred -> rounds at the row ceiling
    last_pending_keys: dict[str, Quantity]  # vetoed|deferred -> latest pending-key sum
    hit_tokens: Quantity
    # vetoed|deferred -> chunk keys (all groups) the latest such round's request
    # covers: the rows a full restore of it needs resident at once.
    last_request_keys: dict[str, Quantity] = field(default_factory=dict)

    def get(self, verdict: S.Verdict) -> Quantity:
        return _q(self.verdicts, verdict.value)

    def ceiling(self, verdict: S.Verdict) -> Quantity:
        return _q(self.at_ceiling, verdict.value)

    def pending_keys(self, verdict: S.Verdict) -> Quantity:
        return _q(self.last_pending_keys, verdict.value)

    def request_keys(self, verdict: S.Verdict) -> Quantity:
        return _q(self.last_request_keys, verdict.value)

    @property
    def total(self) -> float:
        return sum(q.increase for q in self.verdicts.values())


@dataclass(frozen=True)
class Tiers:
    rows: dict[str, Quantity]  # RowState value -> rows
    promotions: dict[str, Quantity]  # PromotionResult value
    cascades: dict[str, Quantity]  # CascadeResult value
    store_jobs: dict[str, Quantity]  # StoreJobResult value
    row_bytes: Quantity = ABSENT  # kvscope_primary_row_bytes (max over targets)
    quarantined_keys: Quantity = ABSENT  # kvscope_quarantined_keys

    def row(self, state: S.RowState) -> Quantity:
        return _q(self.rows, state.value)

    def promotion(self, r: S.PromotionResult) -> Quantity:
        return _q(self.promotions, r.value)

    def cascade(self, r: S.CascadeResult) -> Quantity:
        return _q(self.cascades, r.value)

    def store(self, r: S.StoreJobResult) -> Quantity:
        return _q(self.store_jobs, r.value)


@dataclass(frozen=True)
class Pending:
    transfers: dict[str, Quantity]  # PendingKind value -> transfers not finished
    oldest_seconds: dict[str, Quantity]  # PendingKind value -> age of the oldest (max over targets)

    def get(self, kind: S.PendingKind) -> Quantity:
        return _q(self.transfers, kind.value)

    def oldest(self, kind: S.PendingKind) -> Quantity:
        return _q(self.oldest_seconds, kind.value)


@dataclass(frozen=True)
class Requests:
    states: dict[str, Quantity]  # RequestState value
    in_flight: Quantity
    vllm_running: Quantity
    vllm_waiting: Quantity
    vllm_waiting_by_reason: dict[str, Quantity]
    vllm_queue_time_sum: Quantity
    vllm_queue_time_count: Quantity

    def get(self, state: S.RequestState) -> Quantity:
        return _q(self.states, state.value)

    @property
    def mean_queue_seconds(self) -> float | None:
        n = self.vllm_queue_time_count.increase
        return self.vllm_queue_time_sum.increase / n if n > 0 else None


@dataclass(frozen=True)
class RankTransfers:
    rank: str
    bytes: dict[str, Quantity]  # Direction value
    in_flight: dict[str, Quantity]  # Direction value
    checksums: dict[str, Quantity]  # ChecksumOutcome value
    refused: dict[str, Quantity]  # RefusalReason value
    last_report: Quantity  # kvscope_worker_last_step_timestamp_seconds

    def checksum(self, o: S.ChecksumOutcome) -> Quantity:
        return _q(self.checksums, o.value)

    def refusals(self, r: S.RefusalReason) -> Quantity:
        return _q(self.refused, r.value)


@dataclass(frozen=True)
class Freshness:
    steps: Quantity
    last_step: dict[str, Quantity]  # target -> kvscope_last_step_timestamp_seconds
    now: float

    def age(self, target: str) -> float | None:
        q = self.last_step.get(target)
        if q is None or not q.present:
            return None
        return max(0.0, self.now - q.last)

    @property
    def newest_age(self) -> float | None:
        ages = [a for t in self.last_step if (a := self.age(t)) is not None]
        return min(ages) if ages else None


@dataclass(frozen=True)
class Vllm:
    external_queries: Quantity
    external_hits: Quantity
    offload_load_bytes: Quantity
    offload_store_bytes: Quantity


@dataclass(frozen=True)
class RestoreCoverage:
    """Held vs offered tokens of ended lookup rounds (``kvscope_restore_*``), and the
    latest round a promotion without a free row cut short (``kvscope_last_ceiling_round_*``)."""

    held_tokens: Quantity = ABSENT
    short_rounds: dict[str, Quantity] = field(default_factory=dict)  # ShortReason value
    short_tokens: dict[str, Quantity] = field(default_factory=dict)  # ShortReason value
    ceiling_rounds: dict[str, Quantity] = field(default_factory=dict)  # CeilingForm value
    ceiling_offered: Quantity = ABSENT
    ceiling_held: Quantity = ABSENT
    ceiling_rows_needed: Quantity = ABSENT
    ceiling_concurrent_requests: Quantity = ABSENT
    ceiling_concurrent_rows: Quantity = ABSENT

    def rounds(self, reason: S.ShortReason) -> Quantity:
        return _q(self.short_rounds, reason.value)

    def tokens(self, reason: S.ShortReason) -> Quantity:
        return _q(self.short_tokens, reason.value)

    def ceiling(self, form: S.CeilingForm) -> Quantity:
        return _q(self.ceiling_rounds, form.value)

    def ratio(self, offered: Quantity) -> float | None:
        """Tokens offered / tokens held over the window (``offered``: kvscope_hit_tokens_total)."""
        held = self.held_tokens.increase if self.held_tokens.present else 0.0
        return offered.increase / held if held > 0 else None


@dataclass(frozen=True)
class Evidence:
    source: SourceInfo
    targets: tuple[TargetInfo, ...]
    kv_groups: dict[str, tuple[str, str]]  # group -> (attention kind, tokens_per_block)
    lookups: dict[str, GroupLookups]  # kv_group -> lookups
    rounds: Rounds
    tiers: Tiers
    pending: Pending
    requests: Requests
    ranks: dict[str, RankTransfers]
    freshness: Freshness
    vllm: Vllm
    telemetry_errors: dict[str, Quantity]
    present: frozenset[str] = field(default_factory=frozenset)  # series names seen
    # series name -> label names its series carry (a relabel rule can drop one)
    label_names: dict[str, frozenset[str]] = field(default_factory=dict)
    # series names with NaN/±Inf samples (dropped; checks that need them say so)
    nonfinite: frozenset[str] = field(default_factory=frozenset)
    failures: tuple[str, ...] = ()  # targets/queries that gave nothing usable
    notes: tuple[str, ...] = ()  # what the source or the builder dropped
    coverage: RestoreCoverage = field(default_factory=RestoreCoverage)

    def has(self, metric: S.Metric) -> bool:
        return metric.name in self.present or f"{metric.name}_count" in self.present

    @property
    def primary_rows(self) -> float:
        return self.tiers.row(S.RowState.TOTAL).last

    @property
    def worker_ranks(self) -> dict[str, RankTransfers]:
        """Per-rank series of worker processes (without the manager's disk transfers)."""
        return {k: v for k, v in self.ranks.items() if k != S.RANK_MANAGER}

    @property
    def found_anywhere(self) -> float:
        """Keys found in any tier over the window: primary-tier hits plus promotions
        started or refused for want of a row (both only for a key a secondary
        tier holds)."""
        return sum(g.found for g in self.lookups.values()) + sum(
            self.tiers.promotion(r).increase
            for r in (S.PromotionResult.STARTED, S.PromotionResult.NO_ROW))

    @property
    def kv_group_count(self) -> int:
        return max(len(self.kv_groups), len(self.lookups), 1)

    def info_int(self, name: str) -> int | None:
        """One numeric kvscope_info label, when every target agrees on it."""
        vals = {t.int_label(name) for t in self.targets} - {None}
        return vals.pop() if len(vals) == 1 else None

    @property
    def checksum_policies(self) -> tuple[str, ...]:
        return tuple(sorted({t.checksum_policy for t in self.targets if t.checksum_policy}))

    @property
    def hash_seeds(self) -> tuple[str, ...]:
        seen: list[str] = []
        for t in self.targets:
            for h in t.hash_seeds:
                if h not in seen:
                    seen.append(h)
        return tuple(seen)

    @property
    def idle(self) -> bool:
        """Nothing runs or waits (latest values), by kvscope and, when present, vLLM."""
        r = self.requests
        kv_busy = sum(q.last for q in r.states.values()) + r.in_flight.last
        vllm_busy = (r.vllm_running.last if r.vllm_running.present else 0) + (
            r.vllm_waiting.last if r.vllm_waiting.present else 0
        )
        return kv_busy == 0 and vllm_busy == 0

    def lookups_total(self, result: S.LookupResult) -> float:
        return sum(g.get(result).increase for g in self.lookups.values())


# --------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------
def _step_values(samples, times: list[float]) -> list[float]:
    """The series as a step function evaluated at ``times`` (0 before its first sample)."""
    ts = [t for t, _ in samples]
    out = []
    for t in times:
        i = bisect.bisect_right(ts, t + 1e-9) - 1
        out.append(samples[i][1] if i >= 0 else 0.0)
    return out


def _counter_growth(samples, counts_from_zero: bool) -> float:
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
        increase = _counter_growth(smp, src.lifetime or smp[0][0] > src.start + tol)
        recent_from_zero = not before and smp[0][0] > max(recent_from, born) + tol
        recent = _counter_growth(recent_smp, recent_from_zero)
    else:
        increase = last - first
        recent = recent_smp[-1][1] - recent_smp[0][1] if recent_smp else 0.0
    return first, last, increase, recent


def aggregate(
    series: Iterable[Series], src: SourceInfo, how: str = "sum",
    first_seen: dict[str, float] | None = None,
) -> Quantity:
    """Sum (or max) series into one Quantity; per-series reset handling first.

    ``first_seen``: target -> its first sample time in the window (see
    :func:`_series_quantity`); without it, the window start.
    """
    series = [s for s in series if s.samples]
    if not series:
        return ABSENT
    counter = is_counter(series[0].name)
    fs = first_seen or {}
    parts = [_series_quantity(s, src, counter, fs.get(s.target)) for s in series]
    times = sorted({t for s in series for t, _ in s.samples})
    combine: Callable[[Iterable[float]], float] = sum if how == "sum" else max
    columns = [_step_values(s.samples, times) for s in series]
    timeline = tuple(
        (t, float(combine(vals))) for t, vals in zip(times, zip(*columns, strict=True), strict=True)
    )
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


def _by_label(
    series: list[Series], label: str, src: SourceInfo, how: str = "sum",
    first_seen: dict[str, float] | None = None,
) -> dict[str, Quantity]:
    groups: dict[str, list[Series]] = defaultdict(list)
    for s in series:
        groups[s.label(label)].append(s)
    return {k: aggregate(v, src, how, first_seen) for k, v in sorted(groups.items())}


def build_evidence(raw: RawWindow) -> Evidence:
    """Typed evidence from any source. Raises DiagnoseError when kvscope is absent."""
    src = raw.source
    by_name: dict[str, list[Series]] = defaultdict(list)
    nonfinite: set[str] = set()
    label_names: dict[str, set[str]] = defaultdict(set)
    too_long = 0
    for s in raw.series:
        if s.name not in WANTED_SERIES:
            continue
        if len(s.target) > MAX_LABEL_CHARS or any(
                len(k) > MAX_LABEL_CHARS or len(v) > MAX_LABEL_CHARS for k, v in s.labels):
            too_long += 1
            continue
        s = _finite(s, nonfinite)
        if s.samples:
            by_name[s.name].append(s)
            label_names[s.name].update(k for k, _ in s.labels)
    present = frozenset(by_name)
    if not any(n.startswith(S.PREFIX) for n in present):
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

    # When each target was first sampled: a counter there from that moment on
    # has history from before the window; one that shows up later was born in it.
    fs: dict[str, float] = {}
    for ss in by_name.values():
        for s in ss:
            t = s.samples[0][0]
            if t < fs.get(s.target, math.inf):
                fs[s.target] = t

    def get(metric_or_name) -> list[Series]:
        name = metric_or_name.name if isinstance(metric_or_name, S.Metric) else metric_or_name
        return by_name.get(name, [])

    # per-target info
    targets: list[TargetInfo] = []
    info_by_target: dict[tuple[str, str, str], list[Series]] = defaultdict(list)
    for s in get(S.INFO):
        info_by_target[(s.target, s.label(S.VLLM_LABEL_MODEL), s.label(S.VLLM_LABEL_ENGINE))].append(s)
    for (target, model, engine), ss in sorted(info_by_target.items()):
        ss = sorted(ss, key=lambda s: s.samples[0][0])
        seeds: list[str] = []
        seed_first: dict[str, float] = {}
        for s in ss:
            h = s.label(S.L_HASH_SEED)
            if h not in seeds:
                seeds.append(h)
                seed_first[h] = s.samples[0][0]
        last = max(ss, key=lambda s: s.samples[-1][0])
        targets.append(
            TargetInfo(
                target=target,
                model_name=model,
                engine=engine,
                kvscope_version=last.label(S.L_KVSCOPE_VERSION),
                vllm_version=last.label(S.L_VLLM_VERSION),
                spec=last.label(S.L_SPEC),
                tiers=last.label(S.L_TIERS),
                primary_rows=last.label(S.L_PRIMARY_ROWS),
                hash_seeds=tuple(seeds),
                checksum_policy=last.label(S.L_CHECKSUM_POLICY),
                chunk_tokens=last.label(S.L_CHUNK_TOKENS),
                max_num_batched_tokens=last.label(S.L_MAX_BATCHED_TOKENS),
                seeds_ordered=len(set(seed_first.values())) == len(seed_first) > 1,
            )
        )

    kv_groups: dict[str, tuple[str, str]] = {}
    for s in get(S.KV_GROUP_INFO):
        kv_groups[s.label(S.L_KV_GROUP)] = (s.label(S.L_KIND), s.label(S.L_TOKENS_PER_BLOCK))

    lookups: dict[str, GroupLookups] = {}
    per_group: dict[str, list[Series]] = defaultdict(list)
    for s in get(S.LOOKUPS):
        per_group[s.label(S.L_KV_GROUP)].append(s)
    for g in sorted(set(per_group) | set(kv_groups), key=_natural):
        lookups[g] = GroupLookups(g, _by_label(per_group.get(g, []), S.L_RESULT, src, first_seen=fs))

    rounds = Rounds(
        verdicts=_by_label(get(S.LOOKUP_ROUNDS), S.L_VERDICT, src, first_seen=fs),
        at_ceiling=_by_label(get(S.ROUNDS_AT_ROW_CEILING), S.L_VERDICT, src, first_seen=fs),
        last_pending_keys=_by_label(get(S.LAST_ROUND_PENDING_KEYS), S.L_VERDICT, src, "max", first_seen=fs),
        hit_tokens=aggregate(get(S.HIT_TOKENS), src, first_seen=fs),
        last_request_keys=_by_label(get(S.LAST_ROUND_REQUEST_KEYS), S.L_VERDICT, src, "max",
                                    first_seen=fs),
    )
    tiers = Tiers(
        rows=_by_label(get(S.PRIMARY_ROWS), S.L_STATE, src, first_seen=fs),
        promotions=_by_label(get(S.PROMOTIONS), S.L_RESULT, src, first_seen=fs),
        cascades=_by_label(get(S.CASCADES), S.L_RESULT, src, first_seen=fs),
        store_jobs=_by_label(get(S.STORE_JOBS), S.L_RESULT, src, first_seen=fs),
        row_bytes=aggregate(get(S.PRIMARY_ROW_BYTES), src, "max", first_seen=fs),
        quarantined_keys=aggregate(get(S.QUARANTINED_KEYS), src, first_seen=fs),
    )
    pending = Pending(
        transfers=_by_label(get(S.PENDING_TRANSFERS), S.L_KIND, src, first_seen=fs),
        oldest_seconds=_by_label(get(S.OLDEST_PENDING_TRANSFER), S.L_KIND, src, "max", first_seen=fs),
    )
    requests = Requests(
        states=_by_label(get(S.REQUESTS), S.L_STATE, src, first_seen=fs),
        in_flight=aggregate(get(S.REQUESTS_IN_FLIGHT), src, first_seen=fs),
        vllm_running=aggregate(get(S.VLLM_REQUESTS_RUNNING), src, first_seen=fs),
        vllm_waiting=aggregate(get(S.VLLM_REQUESTS_WAITING), src, first_seen=fs),
        vllm_waiting_by_reason=_by_label(get(S.VLLM_REQUESTS_WAITING_BY_REASON), S.L_REASON, src, first_seen=fs),
        vllm_queue_time_sum=aggregate(get(S.VLLM_REQUEST_QUEUE_TIME + "_sum"), src, first_seen=fs),
        vllm_queue_time_count=aggregate(get(S.VLLM_REQUEST_QUEUE_TIME + "_count"), src, first_seen=fs),
    )

    rank_series: dict[str, dict[str, list[Series]]] = defaultdict(lambda: defaultdict(list))
    for m in (S.TRANSFER_BYTES, S.TRANSFERS_IN_FLIGHT, S.ROW_CHECKSUMS, S.LOADS_REFUSED,
              S.WORKER_LAST_STEP_TIMESTAMP):
        for s in get(m):
            rank_series[s.label(S.L_RANK)][m.name].append(s)
    ranks: dict[str, RankTransfers] = {}
    for rank in sorted(rank_series, key=_natural):
        rs = rank_series[rank]
        ranks[rank] = RankTransfers(
            rank=rank,
            bytes=_by_label(rs[S.TRANSFER_BYTES.name], S.L_DIRECTION, src, first_seen=fs),
            in_flight=_by_label(rs[S.TRANSFERS_IN_FLIGHT.name], S.L_DIRECTION, src, first_seen=fs),
            checksums=_by_label(rs[S.ROW_CHECKSUMS.name], S.L_OUTCOME, src, first_seen=fs),
            refused=_by_label(rs[S.LOADS_REFUSED.name], S.L_REASON, src, first_seen=fs),
            last_report=aggregate(rs[S.WORKER_LAST_STEP_TIMESTAMP.name], src, "max", first_seen=fs),
        )

    last_step: dict[str, list[Series]] = defaultdict(list)
    for s in get(S.LAST_STEP_TIMESTAMP):
        last_step[_target_key(s)].append(s)
    freshness = Freshness(
        steps=aggregate(get(S.SCHEDULER_STEPS), src, first_seen=fs),
        last_step={t: aggregate(ss, src, "max", first_seen=fs) for t, ss in sorted(last_step.items())},
        now=src.now,
    )
    vllm = Vllm(
        external_queries=aggregate(get(S.VLLM_EXTERNAL_PREFIX_QUERIES), src, first_seen=fs),
        external_hits=aggregate(get(S.VLLM_EXTERNAL_PREFIX_HITS), src, first_seen=fs),
        offload_load_bytes=aggregate(get(S.VLLM_OFFLOAD_LOAD_BYTES), src, first_seen=fs),
        offload_store_bytes=aggregate(get(S.VLLM_OFFLOAD_STORE_BYTES), src, first_seen=fs),
    )
    return Evidence(
        source=src,
        targets=tuple(targets),
        kv_groups=kv_groups,
        lookups=lookups,
        rounds=rounds,
        tiers=tiers,
        pending=pending,
        requests=requests,
        ranks=ranks,
        freshness=freshness,
        vllm=vllm,
        telemetry_errors=_by_label(get(S.TELEMETRY_ERRORS), S.L_WHERE, src, first_seen=fs),
        present=present,
        label_names={k: frozenset(v) for k, v in label_names.items()},
        nonfinite=frozenset(nonfinite),
        failures=raw.failures,
        notes=raw.notes + ((
            f"{too_long} series dropped: a label value longer than {MAX_LABEL_CHARS} characters "
            "(kvscope's labels are short; a relabel rule or another exporter made these)",)
            if too_long else ()),
        coverage=RestoreCoverage(
            held_tokens=aggregate(get(S.RESTORE_HELD_TOKENS), src, first_seen=fs),
            short_rounds=_by_label(get(S.RESTORE_SHORT_ROUNDS), S.L_REASON, src, first_seen=fs),
            short_tokens=_by_label(get(S.RESTORE_SHORT_TOKENS), S.L_REASON, src, first_seen=fs),
            ceiling_rounds=_by_label(get(S.RESTORE_CEILING_ROUNDS), S.L_FORM, src,
                                     first_seen=fs),
            ceiling_offered=aggregate(get(S.LAST_CEILING_OFFERED_TOKENS), src, "max", first_seen=fs),
            ceiling_held=aggregate(get(S.LAST_CEILING_HELD_TOKENS), src, "max", first_seen=fs),
            ceiling_rows_needed=aggregate(get(S.LAST_CEILING_ROWS_NEEDED), src, "max",
                                          first_seen=fs),
            ceiling_concurrent_requests=aggregate(get(S.LAST_CEILING_CONCURRENT_REQUESTS), src,
                                                  "max", first_seen=fs),
            ceiling_concurrent_rows=aggregate(get(S.LAST_CEILING_CONCURRENT_ROWS), src, "max",
                                              first_seen=fs),
        ),
    )


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
    parts = [s.target]
    for lbl in (S.VLLM_LABEL_MODEL, S.VLLM_LABEL_ENGINE):
        if v := s.label(lbl):
            parts.append(f"{lbl}={v}")
    return " ".join(parts)


def _natural(key: str):
    return (0, int(key), "") if key.isdigit() else (1, math.inf, key)
