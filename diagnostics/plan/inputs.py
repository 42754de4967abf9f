"""The parser of ``kv-diagnose plan``: a window's evidence (or the command line) to
:class:`~.model.PlanInputs`, each number with where it came from.

Read from the series kvscope exports (through :func:`~..evidence.build.build_evidence`, as the
diagnosis reads them):

* restores and their held prefixes: ``kvscope_restore_coverage_ratio_count`` (ended rounds
  the tiers held at least one chunk of) and ``kvscope_restore_held_tokens_total`` (the tokens
  they held): the mean held prefix; the largest restore from the latest-round gauges'
  maxima (``kvscope_last_ceiling_round_rows_needed``, ``kvscope_last_round_request_keys``);
* the tokens lost by reason (``kvscope_restore_short_tokens_total``): ``row_ceiling`` and
  ``group_veto`` are what rows fix, ``load_cap`` and ``other`` are not;
* restores seen at once: the most any cut round saw
  (``kvscope_ceiling_round_concurrent_requests``, a histogram: its bucket bound), and
  ``kvscope_last_ceiling_round_concurrent_requests`` and
  ``kvscope_requests{state=deferred|loading}`` (latest-value gauges: a lower bound);
* geometry: ``kvscope_info`` (``chunk_tokens``, ``max_num_batched_tokens``),
  ``kvscope_kv_group_info``, ``kvscope_primary_rows{state="total"}``,
  ``kvscope_primary_row_bytes``.

What the command line gives (:class:`Given`) replaces what the window says.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.model import Evidence
from ..model import DiagnoseError, Quantity, RawWindow
from .model import Fact, PlanInputs

ROW_LOSS = (S.ShortReason.ROW_CEILING, S.ShortReason.GROUP_VETO)  # what more rows fix
OTHER_LOSS = (S.ShortReason.LOAD_CAP, S.ShortReason.OTHER)  # the tiers held it; rows do not help
CHECKED_ON = ("0.26", "0.33", "0.34")  # the vLLM releases the coverage model was checked on


@dataclass(frozen=True)
class Given:
    """Numbers from the command line; None: read from the window."""

    held_tokens: int | None = None  # per restore
    concurrency: float | None = None
    chunk_tokens: int | None = None
    kv_groups: int | None = None
    rows: int | None = None
    row_bytes: int | None = None
    reserve_rows: int | None = None
    step_tokens: int | None = None

    def missing(self, *fields: str) -> list[str]:
        """The command-line flags of ``fields`` left unset."""
        return [f"--{f.replace('_', '-')}" for f in fields if getattr(self, f) is None]

    def check(self) -> None:
        for name, v in vars(self).items():
            if v is None:
                continue
            floor = 0 if name == "reserve_rows" else 1
            if v != v or v < floor or v > 1e15:
                raise DiagnoseError(f"--{name.replace('_', '-')} must be "
                                    f"{'>= 0' if floor == 0 else '> 0'} (got {v:g})")


def _opt(v, flag: str) -> Fact | None:
    return Fact(float(v), flag) if v is not None else None


def _gauge_max(q: Quantity) -> float | None:
    return q.max if q.present and q.max > 0 else None


def read_inputs(ev: Evidence | None, given: Given = Given()) -> PlanInputs:
    """The plan's inputs from ``ev`` (None: the command line alone) and ``given``."""
    given.check()
    notes: list[str] = []
    if ev is None:
        return _command_line_only(given)
    cov = ev.coverage
    chunk = _opt(given.chunk_tokens, "--chunk-tokens")
    if chunk is None and (c := ev.info_int("chunk_tokens")):
        chunk = Fact(c, f"{S.INFO.name}{{{S.L_CHUNK_TOKENS}}}")
    groups = _opt(given.kv_groups, "--kv-groups") or Fact(
        ev.kv_group_count, f"{S.KV_GROUP_INFO.name} (KV groups)")
    rows = _opt(given.rows, "--rows")
    if rows is None and ev.tiers.row(S.RowState.TOTAL).present and ev.primary_rows > 0:
        rows = Fact(ev.primary_rows, f'{S.PRIMARY_ROWS.name}{{state="total"}}')
    row_bytes = _opt(given.row_bytes, "--row-bytes")
    if row_bytes is None and (b := _gauge_max(ev.tiers.row_bytes)):
        row_bytes = Fact(b, S.PRIMARY_ROW_BYTES.name)
    step = _opt(given.step_tokens, "--step-tokens")
    if step is None and (t := ev.info_int("max_num_batched_tokens")):
        step = Fact(t, f"{S.INFO.name}{{{S.L_MAX_BATCHED_TOKENS}}}")

    held_total = cov.held_tokens.increase if cov.held_tokens.present else 0.0
    n = cov.held_rounds.increase if cov.held_rounds.present else 0.0
    restores = Fact(n, f"{S.RESTORE_COVERAGE.name}_count") if n > 0 else None
    held = _opt(given.held_tokens, "--held-tokens")
    if held is None and n > 0 and held_total > 0:
        held = Fact(held_total / n, f"{S.RESTORE_HELD_TOKENS.name} / restores")
    elif held is None:
        notes.append("the window has no restore the tiers held a prefix for "
                     f"({S.RESTORE_COVERAGE.name}_count did not grow): pass --held-tokens")

    largest = None
    for q, name in ((cov.ceiling_rows_needed, S.LAST_CEILING_ROWS_NEEDED.name),
                    *((ev.rounds.request_keys(v), f'{S.LAST_ROUND_REQUEST_KEYS.name}{{verdict="{v.value}"}}')
                      for v in (S.Verdict.DEFERRED, S.Verdict.VETOED))):
        if (m := _gauge_max(q)) is not None and (largest is None or m > largest.value):
            largest = Fact(m, f"max of {name}")

    seen = _concurrency_seen(ev)
    coverage_now = row_loss = other_loss = None
    if held_total > 0:
        coverage_now = Fact(min(ev.rounds.hit_tokens.increase / held_total, 1.0),
                            f"{S.HIT_TOKENS.name} / {S.RESTORE_HELD_TOKENS.name}")
        lost = sum(cov.tokens(r).increase for r in ROW_LOSS)
        row_loss = Fact(min(lost / held_total, 1.0),
                        f"{S.RESTORE_SHORT_TOKENS.name}{{reason=row_ceiling|group_veto}} / held")
        other = sum(cov.tokens(r).increase for r in OTHER_LOSS)
        other_loss = Fact(min(other / held_total, 1.0),
                          f"{S.RESTORE_SHORT_TOKENS.name}{{reason=load_cap|other}} / held")
        if not cov.short_tokens:
            notes.append(f"{S.RESTORE_SHORT_TOKENS.name} missing: the tokens the row ceiling "
                         "cut are unknown (read as none)")
    other_vllm = sorted({t.vllm_version for t in ev.targets
                         if t.vllm_version and not t.vllm_version.startswith(CHECKED_ON)})
    if other_vllm:
        notes.append(f"vLLM {', '.join(other_vllm)}: the coverage model was checked on vLLM "
                     f"{', '.join(CHECKED_ON[:-1])} and {CHECKED_ON[-1]} (benchmarks/plan_verify.py, "
                     "tests/connector/test_plan_verify.py): pass "
                     "--concurrency when you know the restores asking at once")
    if len({t.key for t in ev.targets}) > 1:
        notes.append(f"{len(ev.targets)} engines in the window: their restores are summed; "
                     "plan one engine at a time (--selector, or one --scrape target)")
    return PlanInputs(
        source=ev.source, chunk_tokens=chunk, kv_groups=groups, rows_now=rows,
        row_bytes=row_bytes, step_tokens=step, restores=restores, held_per_restore=held,
        largest_rows=largest, concurrency_seen=seen,
        concurrency_given=_opt(given.concurrency, "--concurrency"),
        coverage_now=coverage_now, row_loss=row_loss, other_loss=other_loss,
        reserve_given=_opt(given.reserve_rows, "--reserve-rows"), notes=tuple(notes),
        restore_caps=() if given.kv_groups is not None else tuple(
            c for c in ev.kv_group_restore_chunks.values() if c > 0))


def _concurrency_seen(ev: Evidence) -> Fact | None:
    """Most restores seen at once: the latest cut round's concurrent requests (its own
    included), and restoring requests (deferred + loading) sample by sample."""
    best = None
    q = ev.coverage.ceiling_concurrent_requests
    if (m := _gauge_max(q)) is not None:
        best = Fact(m, f"max of {S.LAST_CEILING_CONCURRENT_REQUESTS.name}")
    if (m := _bucket_max(ev.coverage.ceiling_concurrent_buckets)) is not None and (
            best is None or m > best.value):
        best = Fact(m, f"most in a cut round ({S.CEILING_CONCURRENT_REQUESTS.name}, "
                       "its bucket bound)")
    at: dict[float, float] = {}
    for st in (S.RequestState.DEFERRED, S.RequestState.LOADING):
        for t, v in ev.requests.get(st).samples:
            at[t] = at.get(t, 0.0) + v
    if at and (m := max(at.values())) > 0 and (best is None or m > best.value):
        best = Fact(m, f'max of {S.REQUESTS.name}{{state="deferred"}} + {{state="loading"}}')
    return best


def _bucket_max(buckets: dict) -> float | None:
    """The bound of the lowest bucket holding every observation of the window (the largest
    value observed is at most that, and more than the bucket below), or None."""
    got = sorted((float(le), q.increase) for le, q in buckets.items() if q.present)
    if not got or got[-1][1] <= 0:
        return None
    total = got[-1][1]
    for le, n in got:
        if n >= total and le != float("inf"):
            return le
    return None


def native_inputs(raw: RawWindow, given: Given = Given()) -> PlanInputs:
    """A stock vLLM (0.33+, no kvscope series): the primary tier's geometry from vLLM's
    ``kv_offload_config_info`` (its primary tier's series), restores from the command line.

    ``cpu_kv_cache_size_tokens`` is the tokens the tier holds for requests of
    ``max_model_len``, every KV group's chunks counted: divided by ``cpu_num_chunks`` it is
    a request's tokens per row, which the plan takes as one KV group of that many tokens a
    chunk (sliding-window groups, capped at their window there, make it an upper bound).
    """
    given.check()
    geometry = None
    engines = 0
    for series in raw.series:
        if series.name != S.VLLM_OFFLOAD_CONFIG_INFO or not series.label(
                S.VLLM_TIER_LABEL).endswith(":primary"):
            continue
        engines += 1
        chunks, tokens, size = (series.label(k) for k in (
            "cpu_num_chunks", "cpu_kv_cache_size_tokens", "cpu_kv_cache_size_bytes"))
        if chunks.isdigit() and tokens.isdigit() and int(chunks) > 0 and int(tokens) > 0:
            geometry = (int(chunks), int(tokens), int(size) if size.isdigit() else None)
    missing = given.missing("held_tokens", "concurrency")
    if missing:
        raise DiagnoseError("a stock vLLM (no kvscope series) says nothing of its restores: "
                            "plan needs " + ", ".join(missing))
    info = f'{S.VLLM_OFFLOAD_CONFIG_INFO}{{tier="0:primary"}}'
    rows = _opt(given.rows, "--rows")
    chunk = _opt(given.chunk_tokens, "--chunk-tokens")
    groups = _opt(given.kv_groups, "--kv-groups")
    row_bytes = _opt(given.row_bytes, "--row-bytes")
    if geometry is not None:
        n, tokens, size = geometry
        rows = rows or Fact(n, f"{info} cpu_num_chunks")
        if chunk is None and groups is None:
            chunk = Fact(tokens / n, f"{info} cpu_kv_cache_size_tokens / cpu_num_chunks "
                                     "(a request's tokens per row, every KV group counted)")
            groups = Fact(1, "folded into the tokens per row")
        if row_bytes is None and size:
            row_bytes = Fact(size / n, f"{info} cpu_kv_cache_size_bytes / cpu_num_chunks")
    if chunk is None:
        raise DiagnoseError(f"no {info} with cpu_kv_cache_size_tokens in the window (vLLM "
                            "< 0.33, or a tier without it): pass --chunk-tokens")
    notes = ["a stock vLLM: the restores and their concurrency are the command line's "
             "(install kvscope's connector for the window's own)"]
    if engines > 1:
        notes.append(f"{engines} engines in the window: the last one's geometry is used; "
                     "plan one engine at a time (--selector, or one --scrape target)")
    return PlanInputs(
        source=raw.source, chunk_tokens=chunk, kv_groups=groups or Fact(1, "default"),
        rows_now=rows, row_bytes=row_bytes, step_tokens=_opt(given.step_tokens, "--step-tokens"),
        restores=None, held_per_restore=_opt(given.held_tokens, "--held-tokens"),
        largest_rows=None, concurrency_seen=None,
        concurrency_given=_opt(given.concurrency, "--concurrency"), coverage_now=None,
        row_loss=None, other_loss=None,
        reserve_given=_opt(given.reserve_rows, "--reserve-rows"), notes=tuple(notes))


def _command_line_only(given: Given) -> PlanInputs:
    missing = given.missing("held_tokens", "concurrency", "chunk_tokens")
    if missing:
        raise DiagnoseError("plan without a source needs " + ", ".join(missing)
                            + " (or read them from --scrape, --prometheus or --bundle)")
    return PlanInputs(
        source=None, chunk_tokens=_opt(given.chunk_tokens, "--chunk-tokens"),
        kv_groups=_opt(given.kv_groups, "--kv-groups") or Fact(1, "default (1 KV group)"),
        rows_now=_opt(given.rows, "--rows"), row_bytes=_opt(given.row_bytes, "--row-bytes"),
        step_tokens=_opt(given.step_tokens, "--step-tokens"), restores=None,
        held_per_restore=_opt(given.held_tokens, "--held-tokens"), largest_rows=None,
        concurrency_seen=None, concurrency_given=_opt(given.concurrency, "--concurrency"),
        coverage_now=None, row_loss=None, other_loss=None,
        reserve_given=_opt(given.reserve_rows, "--reserve-rows"))
