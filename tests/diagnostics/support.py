"""Test helpers for kv-diagnose: synthetic windows (single-classifier unit tests
only) and a prometheus-client registry built from the signal contract."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from kvscope.diagnostics.evidence.build import build_evidence
from kvscope.diagnostics.model import RawWindow, Series, SourceInfo
from kvscope.exporters import signals as S
from tests.support.static_metrics import serve

T0 = 1_700_000_000.0  # fixed clock: 2023-11-14 22:13:20 UTC
TARGET = "http://127.0.0.1:9400/metrics"


def window(values: dict, *, t0: float = T0, t1: float | None = None, lifetime: bool = True,
           target: str = TARGET, now: float | None = None, recent_span: float | None = None,
           declare: bool = True):
    """values: {(name, {labels}) or name: [v0, v1, ...]} -> RawWindow, samples spread t0..t1.

    ``declare``: add the zero series the connector declares (:func:`declared`) that
    ``values`` does not give, as a real exporter shows them: every value of the closed
    labels, for every worker rank and KV group ``values`` names (rank 0, group 0 when
    it names none).
    """
    t1 = t0 + 1.0 if t1 is None else t1
    if declare:
        values = _with_declared(values)
    series = []
    for key, vals in values.items():
        name, labels = (key, {}) if isinstance(key, str) else (key[0], dict(key[1]))
        tgt = labels.pop("__target__", target)
        vals = list(vals)
        k = len(vals)
        ts = [t1] if k == 1 else [t0 + (t1 - t0) * i / (k - 1) for i in range(k)]
        series.append(Series(name, tuple(sorted(labels.items())), tgt,
                             tuple((t, float(v)) for t, v in zip(ts, vals, strict=False))))
    src = SourceInfo(kind="scrape" if lifetime else "prometheus", location=target, start=t0, end=t1,
                     now=t1 if now is None else now, lifetime=lifetime,
                     recent_span=(t1 - t0) if recent_span is None else recent_span)
    return RawWindow(src, tuple(series))


def _with_declared(values: dict) -> dict:
    seen: dict[str, set[str]] = {S.L_RANK: set(), S.L_KV_GROUP: set()}
    for key in values:
        for k, v in (() if isinstance(key, str) else key[1]):
            if k in seen and v != S.RANK_MANAGER:
                seen[k].add(v)
    extra: dict = {}
    for rank in sorted(seen[S.L_RANK]) or ["0"]:  # every worker rank and KV group given
        for group in sorted(seen[S.L_KV_GROUP]) or ["0"]:
            extra |= declared(rank, group)
    return {k: v for k, v in extra.items() if k not in values} | values


def on(target: str, values: dict) -> dict:
    """``values`` (as :func:`window` takes them) as scraped from ``target``."""
    out = {}
    for key, vals in values.items():
        name, labels = (key, ()) if isinstance(key, str) else key
        out[(name, (*labels, ("__target__", target)))] = vals
    return out


def engine_on(target: str, values: dict) -> dict:
    """:func:`on`, with the series the connector declares on that target too (as
    :func:`window` adds them on its default target): one engine's whole export."""
    return on(target, _with_declared(values))


def evidence(values: dict, **kw):
    return build_evidence(window(values, **kw))


def L(name: str, **labels):  # noqa: N802  a series key for window()
    return (name, tuple(labels.items()))


def info(seed: str = "a1b2c3", rows: int = 8, **extra):
    return L(S.INFO.name, kvscope_version="0.1.0", vllm_version="0.26.0",
             spec="TieringOffloadingSpec", tiers="cpu+fs", primary_rows=str(rows),
             hash_seed=seed, **extra)


def base(rows: int = 8, steps=(100, 110), last_step=None, seed="a1b2c3") -> dict:
    """A quiet engine: info, rows, steps, freshness, empty request/pending gauges."""
    ls = last_step if last_step is not None else [T0, T0 + 1.0]
    d = {
        info(seed, rows): [1, 1],
        L(S.PRIMARY_ROWS.name, state="total"): [rows, rows],
        L(S.PRIMARY_ROWS.name, state="occupied"): [rows // 2, rows // 2],
        L(S.PRIMARY_ROWS.name, state="in_flight"): [0, 0],
        S.SCHEDULER_STEPS.name: list(steps),
        S.LAST_STEP_TIMESTAMP.name: ls,
        S.REQUESTS_IN_FLIGHT.name: [0, 0],
    }
    for st in S.RequestState:
        d[L(S.REQUESTS.name, state=st.value)] = [0, 0]
    for k in S.PendingKind:
        d[L(S.PENDING_TRANSFERS.name, kind=k.value)] = [0, 0]
        d[L(S.OLDEST_PENDING_TRANSFER.name, kind=k.value)] = [0, 0]
    # vLLM's GPU block pool, settled (nothing held at idle), and the host's memory
    d[L(S.GPU_BLOCKS.name, state=S.GpuBlockState.TOTAL.value)] = [39, 39]
    d[L(S.GPU_BLOCKS.name, state=S.GpuBlockState.IN_USE.value)] = [0, 0]
    d[S.IDLE_GPU_BLOCKS.name] = [0, 0]
    d[S.HOST_MEMORY_AVAILABLE.name] = [40 << 30, 40 << 30]
    d[S.PROCESS_RESIDENT_MEMORY.name] = [3 << 30, 3 << 30]
    return d


def declared(rank: str = "0", group: str = "0") -> dict:
    """The counter series the connector declares at 0 before their first event
    (scheduler.observer/worker.proxy ``declare``): present, so every check can run."""
    d = {S.HIT_TOKENS.name: [0, 0]}
    for v in S.Verdict:
        d[L(S.LOOKUP_ROUNDS.name, verdict=v.value)] = [0, 0]
    for v in (S.Verdict.VETOED, S.Verdict.DEFERRED):
        d[L(S.ROUNDS_AT_ROW_CEILING.name, verdict=v.value)] = [0, 0]
    for r in S.LookupResult:
        d[L(S.LOOKUPS.name, kv_group=group, result=r.value)] = [0, 0]
    for metric, enum in ((S.STORE_JOBS, S.StoreJobResult), (S.PROMOTIONS, S.PromotionResult),
                         (S.CASCADES, S.CascadeResult)):
        for x in enum:
            d[L(metric.name, result=x.value)] = [0, 0]
    d[S.RESTORE_HELD_TOKENS.name] = [0, 0]
    for x in S.ShortReason:
        d[L(S.RESTORE_SHORT_ROUNDS.name, reason=x.value)] = [0, 0]
        d[L(S.RESTORE_SHORT_TOKENS.name, reason=x.value)] = [0, 0]
        d[L(S.RESTORE_STOPPED_ROUNDS.name, kv_group=group, reason=x.value)] = [0, 0]
    for x in S.CeilingForm:
        d[L(S.RESTORE_CEILING_ROUNDS.name, form=x.value)] = [0, 0]
    for o in S.ChecksumOutcome:
        d[L(S.ROW_CHECKSUMS.name, rank=rank, outcome=o.value)] = [0, 0]
    for x in S.RefusalReason:
        d[L(S.LOADS_REFUSED.name, rank=rank, reason=x.value)] = [0, 0]
    for x in S.ErrorSite:
        d[L(S.TELEMETRY_ERRORS.name, where=x.value)] = [0, 0]
    return d


def info_values(**over: str) -> list[str]:
    """kvscope_info label values in the contract's order (positional .labels())."""
    d = dict(kvscope_version="0.1.0", vllm_version="0.26.0", spec="TieringOffloadingSpec",
             tiers="cpu+fs", primary_rows="8", hash_seed="s", checksum_policy="refuse",
             chunk_tokens="16", max_num_batched_tokens="256", world_size="1")
    d.update(over)
    return [d[name] for name in S.INFO.labels]


# ---- a registry built from the contract (parser/source tests) --------------
def contract_registry(extra_labels: dict[str, str] | None = None):
    """One prometheus-client metric per signal; returns (registry, {name: metric})."""
    reg = CollectorRegistry()
    extra = dict(extra_labels or {})
    metrics = {}
    for m in S.ALL_METRICS:
        labels = list(extra) + list(m.labels)
        if m.kind is S.Kind.COUNTER:
            metrics[m.name] = Counter(m.base, m.help, labels, registry=reg)
        elif m.kind is S.Kind.GAUGE:
            metrics[m.name] = Gauge(m.name, m.help, labels, registry=reg)
        else:
            metrics[m.name] = Histogram(m.name, m.help, labels, buckets=m.buckets, registry=reg)
    return reg, metrics


def declare(metrics: dict, rank: str = "0") -> None:
    """Create the series a real engine always exports (the connector's declared
    counters, the gauges it sets every step) at 0 in a :func:`contract_registry`."""
    for key in declared(rank):
        if not isinstance(key, str):  # unlabelled metrics are always exported
            metrics[key[0]].labels(**dict(key[1]))
    for st in S.RequestState:
        metrics[S.REQUESTS.name].labels(st.value).set(0)
    for k in S.PendingKind:
        metrics[S.PENDING_TRANSFERS.name].labels(k.value).set(0)
        metrics[S.OLDEST_PENDING_TRANSFER.name].labels(k.value).set(0)
    metrics[S.REQUESTS_IN_FLIGHT.name].set(0)
    metrics[S.GPU_BLOCKS.name].labels(S.GpuBlockState.TOTAL.value).set(39)
    metrics[S.GPU_BLOCKS.name].labels(S.GpuBlockState.IN_USE.value).set(0)


def serve_registry(reg):
    return serve(lambda: generate_latest(reg))
