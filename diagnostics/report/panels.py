"""The decisive comparison of each finding, as plot panels (no matplotlib here).

``BUILDERS`` maps a finding id to the panels its verdict rests on; a finding
without a builder (a class added later) gets the marks-driven overview. A panel
whose data lines are all zero shows nothing and is left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Finding, Quantity, Samples
from ..thresholds import Thresholds

PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink",
           "tab:olive", "tab:cyan")


@dataclass
class Line:
    label: str
    samples: Samples
    style: str = "-"
    color: str | None = None


@dataclass
class Ref:
    label: str
    value: float
    color: str = "black"


@dataclass
class Panel:
    key: str
    title: str
    lines: list[Line] = field(default_factory=list)
    refs: list[Ref] = field(default_factory=list)
    ylabel: str = ""
    mark_keys: frozenset[str] = frozenset()
    note: str = ""  # the decisive numbers, written on the panel

    @property
    def shows_something(self) -> bool:
        return any(v != 0 for ln in self.lines for _, v in ln.samples)


def _line(label: str, q: Quantity | None, **kw) -> list[Line]:
    return [Line(label, q.samples, **kw)] if q is not None and q.present and q.samples else []


def _rows(ev: Evidence) -> list[Line]:
    return _line("primary rows (total)", ev.tiers.row(S.RowState.TOTAL), style="--", color="black")


def _n(x: float) -> str:
    return f"{x:,.0f}" if abs(x - round(x)) < 1e-9 else f"{x:,.2f}"


def _rounds(ev: Evidence, *verdicts: S.Verdict) -> Panel:
    lines = [ln for v in verdicts for ln in _line(f"{v.value} rounds", ev.rounds.get(v))]
    return Panel("rounds", "lookup rounds by verdict (cumulative)", lines,
                 mark_keys=frozenset({"rounds"}))


def _veto(ev: Evidence, th: Thresholds) -> list[Panel]:
    r = ev.rounds
    V = S.Verdict.VETOED
    pk, rk, rows = r.pending_keys(V), r.request_keys(V), ev.primary_rows
    note = f"primary rows: {_n(rows)}"
    if pk.present:
        note += f"; pending-key sum of a vetoed round: max {_n(pk.max)}" + (
            " (= every row pinned)" if pk.max >= rows > 0 else "")
    if rk.present:
        note += f"; the vetoed request covers {_n(rk.max)} keys"
    ceiling = Panel(
        "ceiling", "pending keys of the latest vetoed round vs primary rows: at the line, no row is left",
        _line("pending-key sum (vetoed)", pk, color="tab:red")
        + _line("keys the vetoed request covers", rk, color="tab:orange")
        + _rows(ev), ylabel="keys / rows", mark_keys=frozenset({"rounds"}), note=note)
    rounds = _rounds(ev, V, S.Verdict.HIT)
    rounds.lines += _line("vetoed rounds at the row ceiling", r.ceiling(V), style="--", color="tab:red")
    return [ceiling, rounds]


def _livelock(ev: Evidence, th: Thresholds) -> list[Panel]:
    started, rows = ev.tiers.promotion(S.PromotionResult.STARTED), ev.primary_rows
    hits = ev.rounds.get(S.Verdict.HIT)
    note = (f"last {ev.source.recent_span:.0f} s: {_n(started.recent)} promotions started = "
            f"{started.recent / rows:.1f}x the {_n(rows)}-row tier, {_n(hits.recent)} hit rounds"
            if rows > 0 else "")
    churn = Panel(
        "promotions", "promotions started (cumulative) vs primary rows: churn without a restore",
        _line("promotions started", started, color="tab:purple")
        + _line("promotions with no free row", ev.tiers.promotion(S.PromotionResult.NO_ROW))
        + _rows(ev), mark_keys=frozenset({"promotions"}), note=note)
    return [churn, _rounds(ev, S.Verdict.DEFERRED, S.Verdict.HIT)]


def _stale_rows(ev: Evidence, th: Thresholds) -> list[Panel]:
    mism = Panel("checksums", "promoted-row checksum mismatches by rank (cumulative)",
                 mark_keys=frozenset({"checksums"}))
    refused = Panel("refused", "loads refused by rank (vLLM recomputed them)")
    per_rank, per_refused = [], []
    for i, (rank, rt) in enumerate(ev.worker_ranks.items()):
        c = PALETTE[i % len(PALETTE)]
        bad, good = rt.checksum(S.ChecksumOutcome.MISMATCH), rt.checksum(S.ChecksumOutcome.MATCH)
        mism.lines += _line(f"rank {rank}", bad, color=c)
        per_rank.append(f"rank {rank}: {_n(bad.increase)} of {_n(bad.increase + good.increase)}")
        ref = _sum(rt.refused.values())
        refused.lines += _line(f"rank {rank}", ref, color=c)
        per_refused.append(f"rank {rank}: {_n(sum(q.increase for q in rt.refused.values()))}")
    mism.note = "mismatched: " + "; ".join(per_rank) + " | refused loads: " + "; ".join(per_refused)
    refused.note = "refused loads: " + "; ".join(per_refused)
    return [mism, refused]


def _pending(ev: Evidence, th: Thresholds) -> list[Panel]:
    ages = {k: q for k, q in ev.pending.oldest_seconds.items() if q.present and q.max > 0}
    note = "; ".join(f"{k}: {_n(ev.pending.get(S.PendingKind(k)).last) if k in ev.pending.transfers else '?'}"
                     f" pending, oldest {q.last:.1f} s" for k, q in ages.items()
                     if k in {p.value for p in S.PendingKind})
    age = Panel("pending", "age of the oldest pending transfer vs --stuck-after",
                [ln for k, q in ages.items() for ln in _line(f"oldest {k}", q)],
                [Ref("--stuck-after", th.pending_after_s, "tab:red")], ylabel="seconds",
                mark_keys=frozenset({"pending"}),
                note=(note + f"; requests in flight: {_n(ev.requests.in_flight.last)}")
                if note and ev.requests.in_flight.present else note)
    req = ev.requests
    busy = Panel("requests", "work in flight (engine idle when all are 0)",
                 _line("pending transfers", _sum(ev.pending.transfers.values()), color="tab:red")
                 + _line("kvscope requests in flight", req.in_flight)
                 + _line("vLLM running", req.vllm_running) + _line("vLLM waiting", req.vllm_waiting),
                 mark_keys=frozenset({"requests"}))
    return [age, busy]


def _settling(ev: Evidence, th: Thresholds) -> list[Panel]:
    st, req = ev.settling, ev.requests
    held, total = st.idle_gpu_blocks, st.blocks(S.GpuBlockState.TOTAL)
    blocks = Panel(
        "settling", "GPU KV blocks held at idle vs in use, and requests in flight",
        _line("held at idle (nothing in flight)", held, color="tab:red")
        + _line("in use", st.blocks(S.GpuBlockState.IN_USE), color="tab:blue")
        + _line("kvscope requests in flight", req.in_flight, color="tab:green"),
        ylabel="blocks / requests", mark_keys=frozenset({"settling"}),
        note=(f"held at idle: {_n(held.last)}" + (f" of {_n(total.last)} blocks"
                                                  if total.present else "")
              if held.present else ""))
    avail, rss = st.host_available, st.process_resident
    memory = Panel(
        "host_memory", "the host's available memory vs the engine process's resident memory",
        _line("host available", avail, color="tab:blue")
        + _line("engine process resident", rss, color="tab:orange"), ylabel="bytes",
        mark_keys=frozenset({"host_memory"}),
        note=(f"host available {avail.first / 2**30:.2f} → {avail.last / 2**30:.2f} GiB"
              + (f"; engine process {rss.first / 2**30:.2f} → {rss.last / 2**30:.2f} GiB"
                 if rss.present else "") if avail.present else ""))
    return [blocks, memory]


def _store_never_fits(ev: Evidence, th: Thresholds) -> list[Panel]:
    t = ev.tiers
    return [Panel("stores", "store jobs refused (no_space) vs prepared, and what reached the disk",
                  _line("no_space", t.store(S.StoreJobResult.NO_SPACE), color="tab:red")
                  + _line("prepared", t.store(S.StoreJobResult.PREPARED), color="tab:green")
                  + _line("keys cascaded to disk", t.cascade(S.CascadeResult.COMPLETED), style="--"),
                  mark_keys=frozenset({"stores"}),
                  note=f"{_n(t.store(S.StoreJobResult.NO_SPACE).increase)} store jobs refused, "
                       f"{_n(t.cascade(S.CascadeResult.COMPLETED).last)} keys on disk; primary tier "
                       f"{_n(ev.primary_rows)} rows")]


def _tier_data_lost(ev: Evidence, th: Thresholds) -> list[Panel]:
    t = ev.tiers
    lost = sum(q.increase for q in t.lost_keys.values())
    return [Panel("stores", "keys the disk tier confirmed written vs keys found gone (cumulative)",
                  _line("keys cascaded to disk", t.cascade(S.CascadeResult.COMPLETED),
                        color="tab:green")
                  + [ln for tier, q in t.lost_keys.items()
                     for ln in _line(f"{tier} keys lost", q, color="tab:red")],
                  mark_keys=frozenset({"stores"}),
                  note=f"{_n(lost)} keys lost, "
                       f"{_n(t.promotion(S.PromotionResult.COMPLETED).increase)} promotions "
                       "completed")]


def _stores_without_restores(ev: Evidence, th: Thresholds) -> list[Panel]:
    t = ev.tiers
    lookups = Panel("lookups", "keys stored vs keys found (cumulative)",
                    _line("store jobs prepared", t.store(S.StoreJobResult.PREPARED), color="tab:green")
                    + _line("keys cascaded to disk", t.cascade(S.CascadeResult.COMPLETED))
                    + [ln for g in ev.lookups.values() for ln in
                       _line(f"kv_group {g.group} found", _sum(
                           [g.get(S.LookupResult.HIT), g.get(S.LookupResult.HIT_PENDING)]))])
    seeds = [f"{t.target}: {' -> '.join(t.hash_seeds)}" for t in ev.targets if len(t.hash_seeds) > 1]
    lookups.note = (f"hash_seed differs ({'; '.join(seeds)}); " if seeds else "") + \
        f"found in any tier: {_n(ev.found_anywhere)} keys"
    return [lookups, _rounds(ev, S.Verdict.HIT, S.Verdict.MISS, S.Verdict.VETOED)]


def _queue(ev: Evidence, th: Thresholds) -> list[Panel]:
    req = ev.requests
    queued = req.get(S.RequestState.QUEUED)
    recent = sum(q.recent for q in ev.rounds.verdicts.values())
    note = (f"queued now: {_n(queued.last)}"
            + (f", vLLM waiting {_n(req.vllm_waiting.last)}" if req.vllm_waiting.present else "")
            + f"; lookup rounds in the last {ev.source.recent_span:.0f} s: {_n(recent)}")
    return [Panel("requests", "requests waiting for admission vs lookup rounds issued",
                  _line("kvscope queued", queued, color="tab:red")
                  + _line("vLLM waiting", req.vllm_waiting) + _line("vLLM running", req.vllm_running),
                  mark_keys=frozenset({"requests"}), note=note),
            _rounds(ev, *S.Verdict)]


def _stale_telemetry(ev: Evidence, th: Thresholds) -> list[Panel]:
    lines = [Line(f"step age, {t}", tuple((ts, max(0.0, ts - v)) for ts, v in q.samples))
             for t, q in ev.freshness.last_step.items() if q.present]
    return [Panel("freshness", "age of the latest scheduler step vs --stale-after", lines,
                  [Ref("--stale-after", th.stale_after_s, "tab:red")], ylabel="seconds",
                  mark_keys=frozenset({"requests"}))]


def _anomaly(ev: Evidence, th: Thresholds) -> list[Panel]:
    out = [_rounds(ev, *S.Verdict)]
    r = ev.rounds
    out[0].note = (f"{_n(r.total)} rounds: " + ", ".join(
        f"{_n(r.get(v).increase)} {v.value}" for v in S.Verdict)) if r.verdicts else ""
    age = _pending(ev, th)[0]
    age.refs.append(Ref(f"{th.anomaly_stuck_factor:g}x --stuck-after",
                        th.anomaly_stuck_factor * th.pending_after_s, "darkred"))
    return out + [age, _pending(ev, th)[1]]


def _coverage(ev: Evidence, th: Thresholds) -> list[Panel]:
    cov = ev.coverage
    ratio = cov.ratio(ev.rounds.hit_tokens)
    tokens = Panel(
        "coverage", "tokens the tiers held for ended rounds vs tokens offered to load (cumulative)",
        _line("held (a full restore)", cov.held_tokens, color="black", style="--")
        + _line("offered", ev.rounds.hit_tokens, color="tab:green")
        + [ln for k, q in cov.short_tokens.items() if q.max > 0 for ln in _line(f"short: {k}", q)],
        mark_keys=frozenset({"rounds", "coverage"}),
        note=(f"coverage {ratio:.0%} ({_n(ev.rounds.hit_tokens.increase)} of "
              f"{_n(cov.held_tokens.increase)} held tokens offered)") if ratio is not None else "")
    need = cov.ceiling_rows_needed
    rows = Panel(
        "ceiling", "rows the cut-short round needed vs primary rows",
        _line("rows needed (latest ceiling round)", need, color="tab:red")
        + _line("rows of concurrent restores", cov.ceiling_concurrent_rows, color="tab:orange")
        + _rows(ev), ylabel="rows",
        note=(f"needed {_n(need.max)} rows" + (
            f", {_n(cov.ceiling_concurrent_rows.max)} with the concurrent restores"
            if cov.ceiling_concurrent_rows.present else "") + f"; the tier has {_n(ev.primary_rows)}"
              if need.present else ""))
    return [tokens, rows]


def _overview(ev: Evidence, th: Thresholds) -> list[Panel]:
    hits = Panel("hit_tokens", "tokens offered to load (cumulative)",
                 _line("hit tokens", ev.rounds.hit_tokens, color="tab:green"))
    return [_rounds(ev, *S.Verdict), hits]


def _sum(qs) -> Quantity | None:
    acc: dict[float, float] = {}
    for q in qs:
        for t, v in q.samples:
            acc[t] = acc.get(t, 0.0) + v
    return Quantity(samples=tuple(sorted(acc.items())), present=True) if acc else None


BUILDERS: dict[str, Callable[[Evidence, Thresholds], list[Panel]]] = {
    "capacity_ceiling_veto": _veto,
    "capacity_ceiling_livelock": _livelock,
    "capacity_ceiling_truncated": _coverage,
    "capacity_ceiling_concurrency": _coverage,
    "stale_row_corruption": _stale_rows,
    "pending_at_idle": _pending,
    "not_settled_at_idle": _settling,
    "store_never_fits": _store_never_fits,
    "stores_without_restores": _stores_without_restores,
    "tier_data_lost": _tier_data_lost,
    "queue_wait": _queue,
    "stale_telemetry": _stale_telemetry,
    "unclassified_anomaly": _anomaly,
}


def panels_for(report) -> list[Panel]:
    """Panels of every incident finding, in rank order, each key once; the
    overview when none has any (healthy, inconclusive, a class without a builder)."""
    ev, th = report.evidence, report.thresholds or Thresholds()
    if ev is None:
        return [Panel("rounds", "no evidence")]
    out: dict[str, Panel] = {}
    findings: list[Finding] = [f for f in report.verdicts if f.kind == "incident"]
    for f in findings:
        for p in BUILDERS.get(f.id.split(":")[0], lambda e, t: [])(ev, th):
            if p.key not in out and p.shows_something:
                out[p.key] = p
    if not out:
        out = {p.key: p for p in _overview(ev, th) if p.shows_something}
    return list(out.values()) or [_overview(ev, th)[0]]
