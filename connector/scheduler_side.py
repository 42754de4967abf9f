"""Scheduler-side instrumentation: manager proxy, tier taps, round verdicts, step gauges.

Nothing here changes what vLLM decides. The proxy and the taps forward every
call unchanged and record what passed through; every recording is guarded so
that an exception in kvscope is counted (``kvscope_telemetry_errors_total``)
and never reaches vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Tracer

from kvscope import __version__
from kvscope.connector import compat
from kvscope.connector.checksums import ChecksumPolicy, digest_slots
from kvscope.connector.compat import load_failures
from kvscope.connector.coverage import Coverage, MissCause, group_suffixes, judge
from kvscope.exporters import signals
from kvscope.exporters.otel import request_id_hash, tracing_enabled
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import (
    Direction,
    ErrorSite,
    LookupResult,
    PendingKind,
    PromotionResult,
    RequestState,
    RowState,
    ShortReason,
    Verdict,
)

_RESULTS = tuple(LookupResult)
_VERDICT_LABELS = {v: (v.value,) for v in Verdict}
_ROW_LABELS = {s: (s.value,) for s in RowState}
_KIND_LABELS = {k: (k.value,) for k in PendingKind}
_STATE_LABELS = {s: (s.value,) for s in RequestState}
_MISS = compat.MISS
_REASON_LABELS = {r: (r.value,) for r in ShortReason}
_NOT_STORED = _REASON_LABELS[ShortReason.NOT_STORED]
_RESTORING = (RequestState.DEFERRED, RequestState.LOADING)
# Freshness gauges move at most this often: alerts compare them with minutes,
# and an unchanged gauge costs nothing on vLLM's per-step stats path.
TIMESTAMP_RESOLUTION_S = 1.0
GAUGE_REFRESH_S = 0.05


class Round:
    """One get_num_new_matched_tokens call: lookup results per KV group.

    The hot path only counts raw (group suffix, vLLM result) pairs; decoding into
    label values happens once per round / per step.
    """

    __slots__ = ("started_ns", "raw", "no_row", "refused", "first_miss", "found",
                 "self_evicted", "_per_group")

    def __init__(self, started_ns: int) -> None:
        self.started_ns = started_ns
        self.raw: dict[tuple[bytes, Any], int] = {}
        self.no_row = 0  # promotions refused during this round: the primary tier was full
        self.refused = False  # the lookup in progress had its promotion refused
        # group suffix -> (first key answered MISS, why): where each group's scan stopped
        self.first_miss: dict[bytes, tuple[bytes, MissCause]] = {}
        self.found: set[bytes] = set()  # keys some tier holds (lookup not MISS)
        # rows this round found that its own promotions evicted again (vLLM 0.33:
        # lookups no longer touch rows, so a full tier evicts instead of refusing)
        self.self_evicted = 0
        self._per_group: dict[int, list[int]] | None = None

    def on_miss(self, suffix: bytes, key: bytes, quarantined: bool) -> None:
        cause = (MissCause.QUARANTINED if quarantined
                 else MissCause.REFUSED if self.refused else MissCause.ABSENT)
        self.refused = False
        if suffix not in self.first_miss:
            self.first_miss[suffix] = (key, cause)

    @property
    def per_group(self) -> dict[int, list[int]]:
        """group -> counts ordered as ``_RESULTS``."""
        if self._per_group is None:
            out: dict[int, list[int]] = {}
            for (suffix, result), n in self.raw.items():
                counts = out.setdefault(int.from_bytes(suffix, "big"), [0] * len(_RESULTS))
                counts[_RESULTS.index(compat.LOOKUP_RESULT[result])] += n
            self._per_group = out
        return self._per_group

    def totals(self) -> dict[Any, int]:
        """vLLM LookupResult -> keys, over all groups."""
        out: dict[Any, int] = {}
        for (_, result), n in self.raw.items():
            out[result] = out.get(result, 0) + n
        return out

    @property
    def pending_keys(self) -> int:
        t = self.totals()
        return t.get(compat.RETRY, 0) + t.get(compat.HIT_PENDING, 0)

    def at_row_ceiling(self, rows_total: int) -> bool:
        """The keys this round found reached the row count and its promotions ran
        out of rows: refused for want of a free row (0.26, ``no_row``) or evicting
        rows the round itself found (0.33, ``self_evicted``). Async-lookup RETRYs
        alone can also reach the row count (a working set exactly the tier's size)."""
        return (rows_total > 0 and len(self.found) >= rows_total
                and (self.no_row > 0 or self.self_evicted > 0))

    def verdict(self, num_tokens: int | None) -> Verdict:
        if num_tokens is None:
            return Verdict.DEFERRED
        if num_tokens > 0:
            return Verdict.HIT
        t = self.totals()
        found = t.get(compat.HIT, 0) + t.get(compat.RETRY, 0) + t.get(compat.HIT_PENDING, 0)
        return Verdict.VETOED if found else Verdict.MISS


@dataclass
class _TierJob:
    started: float
    rows: list[int]
    keys: list[bytes]
    tier: str


class _RequestStates:
    """Request states with counts kept incrementally (no per-step scan of all requests)."""

    def __init__(self) -> None:
        self.state: dict[str, RequestState] = {}
        self.counts: dict[RequestState, int] = {s: 0 for s in RequestState}
        self.deferred: set[str] = set()

    def __len__(self) -> int:
        return len(self.state)

    def set(self, rid: str, new: RequestState, *, known_only: bool = False) -> None:
        old = self.state.get(rid)
        if old is new or (known_only and old is None):
            return
        if old is not None:
            self.counts[old] -= 1
        self.state[rid] = new
        self.counts[new] += 1
        if new is RequestState.DEFERRED:
            self.deferred.add(rid)
        else:
            self.deferred.discard(rid)

    def drop(self, rid: str) -> None:
        old = self.state.pop(rid, None)
        if old is not None:
            self.counts[old] -= 1
            self.deferred.discard(rid)


class ManagerProxy:
    """Stands in for the OffloadingManager the connector scheduler talks to.

    Every method forwards to the real manager; ``lookup``, ``prepare_load`` and
    ``prepare_store`` also record. Attributes not defined here (``primary_tier``,
    ``secondary_tiers``, 0.33's ``lock``, ...) resolve on the real manager.
    """

    def __init__(self, inner: Any, observer: SchedulerObserver) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_obs", observer)
        object.__setattr__(self, compat.WRAPPED_MARK, True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def lookup(self, key, req_context, *args, **kwargs):
        if key in self._obs.quarantine:  # a rank refused these bytes: recompute instead
            self._obs.on_lookup(key, compat.MISS, True)
            return compat.MISS
        result = self._inner.lookup(key, req_context, *args, **kwargs)
        self._obs.on_lookup(key, result)
        return result

    def prepare_load(self, keys, req_context, *args, **kwargs):
        spec = self._inner.prepare_load(keys, req_context, *args, **kwargs)
        self._obs.on_prepare_load(keys, spec)
        return spec

    def prepare_store(self, keys, req_context, *args, **kwargs):
        out = self._inner.prepare_store(keys, req_context, *args, **kwargs)
        self._obs.on_prepare_store(out)
        return out


class SchedulerObserver:
    """All scheduler-side state kvscope keeps; one per connector instance."""

    def __init__(self, *, recorder: Recorder, tracer: Tracer, connector_scheduler: Any,
                 spec: Any, vllm_config: Any, kv_cache_config: Any,
                 checksum_policy: str = ChecksumPolicy.REFUSE) -> None:
        self.rec = recorder
        self.tracer = tracer
        self.cs = connector_scheduler
        self.spec = spec
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.checksum_policy = checksum_policy

        inner = connector_scheduler.manager
        if not getattr(inner, compat.WRAPPED_MARK, False):
            connector_scheduler.manager = ManagerProxy(inner, self)
        self.primary = compat.primary_tier(inner)
        self.tiers = compat.secondary_tiers(inner)
        self.geometry = compat.region_geometry(spec)
        self._view = compat.scheduler_view(inner) if self.tiers else None

        self._round: Round | None = None
        self._groups = group_suffixes(compat.lookup_groups(connector_scheduler))
        self._need: dict[str, int] = {}  # request -> chunk keys its whole prefix covers
        self._lookup_counts: dict[tuple[bytes, Any], int] = {}
        self._requests = _RequestStates()
        self._looked_up: set[str] = set()  # requests with a lookup round this step
        self._promotions: dict[int, _TierJob] = {}
        self._cascades: dict[int, _TierJob] = {}
        self._job_first_seen: dict[int, float] = {}
        # key -> (row, per-rank digests) of rows filled by a completed promotion
        self._expected: dict[bytes, tuple[int, tuple[int, ...]]] = {}
        self._fingerprint_src: object = None
        # Refused loads: a rank's copy of these keys' rows differs from the
        # scheduler host's. Without this, vLLM's recompute would look the same
        # keys up, load and be refused again, forever.
        self.quarantine: dict[bytes, None] = {}  # insertion-ordered set (oldest trimmed)
        self._load_keys: dict[int, list[bytes]] = {}  # id(load spec) -> keys, until meta
        # job -> (GPU blocks, keys, request id)
        self._load_jobs: dict[int, tuple[set[int], list[bytes], str | None]] = {}
        self._static_done = False
        self._stamped = 0.0
        self._gauges_at = 0.0
        self._tracing = tracing_enabled(tracer)

        with self.rec.guard(ErrorSite.TIER):
            for tier in self.tiers:
                self._tap_tier(tier)
            self._tap_primary()
        self._declare_series()

    def _declare_series(self) -> None:
        rec, one = self.rec, lambda enum: [(v.value,) for v in enum]
        groups = range(len(compat.kv_group_kinds(self.kv_cache_config)) or 1)
        rec.declare(signals.LOOKUPS, *[(str(g), r.value) for g in groups for r in LookupResult])
        rec.declare(signals.LOOKUP_ROUNDS, *one(Verdict))
        rec.declare(signals.ROUNDS_AT_ROW_CEILING,
                    (Verdict.VETOED.value,), (Verdict.DEFERRED.value,))
        rec.declare(signals.STORE_JOBS, *one(signals.StoreJobResult))
        rec.declare(signals.TELEMETRY_ERRORS, *one(ErrorSite))
        rec.declare(signals.HIT_TOKENS)
        rec.declare(signals.RESTORE_HELD_TOKENS)
        rec.declare(signals.RESTORE_SHORT_ROUNDS, *one(ShortReason))
        rec.declare(signals.RESTORE_SHORT_TOKENS, *one(ShortReason))
        rec.declare(signals.SCHEDULER_STEPS)
        if self.tiers:
            rec.declare(signals.PROMOTIONS, *one(PromotionResult))
            rec.declare(signals.CASCADES, *one(signals.CascadeResult))
            rec.declare(signals.TRANSFER_BYTES, (signals.RANK_MANAGER, Direction.DISK_TO_CPU.value),
                        (signals.RANK_MANAGER, Direction.CPU_TO_DISK.value))

    # ---- taps on tier instances (instance-attribute shadowing) ------------
    def _tap_primary(self) -> None:
        primary = self.primary
        original = getattr(primary, "prepare_write", None)
        if original is None or getattr(original, compat.WRAPPED_MARK, False) or not self.tiers:
            return

        def prepare_write(keys, req_context, *a, **kw):
            out = original(keys, req_context, *a, **kw)
            with self.rec.guard(ErrorSite.TIER):
                if out is None:
                    self.rec.inc(signals.PROMOTIONS, (PromotionResult.NO_ROW.value,), len(keys))
                    if self._round is not None:
                        self._round.no_row += len(keys)
                        self._round.refused = True
                else:
                    self.rec.inc(signals.PROMOTIONS, (PromotionResult.STARTED.value,),
                                 len(out.keys_to_store))
                    rnd = self._round
                    if rnd is not None and out.evicted_keys:
                        rnd.self_evicted += sum(k in rnd.found for k in out.evicted_keys)
                    self._forget(out.evicted_keys)
                    self._forget(out.keys_to_store)
            return out

        setattr(prepare_write, compat.WRAPPED_MARK, True)
        primary.prepare_write = prepare_write

    def _tap_tier(self, tier: Any) -> None:
        if getattr(tier, compat.WRAPPED_MARK, False):
            return
        name = compat.tier_type(tier)
        submit_load, submit_store = tier.submit_load, tier.submit_store
        get_finished_jobs = tier.get_finished_jobs

        def tap_submit_load(job, *a, **kw):
            with self.rec.guard(ErrorSite.TIER):
                self._promotions[job.job_id] = _TierJob(
                    time.monotonic(), compat.job_rows(job), compat.job_keys(job), name)
            return submit_load(job, *a, **kw)

        def tap_submit_store(job, *a, **kw):
            with self.rec.guard(ErrorSite.TIER):
                keys = compat.job_keys(job)
                self._cascades[job.job_id] = _TierJob(
                    time.monotonic(), compat.job_rows(job), keys, name)
                self.rec.inc(signals.CASCADES, (signals.CascadeResult.STARTED.value,), len(keys))
            return submit_store(job, *a, **kw)

        def tap_get_finished_jobs(*a, **kw):
            results = list(get_finished_jobs(*a, **kw))
            with self.rec.guard(ErrorSite.TIER):
                for res in results:
                    self._on_tier_job_done(res.job_id, bool(res.success))
            return results

        tier.submit_load = tap_submit_load
        tier.submit_store = tap_submit_store
        tier.get_finished_jobs = tap_get_finished_jobs
        setattr(tier, compat.WRAPPED_MARK, True)

    def _on_tier_job_done(self, job_id: int, success: bool) -> None:
        now = time.monotonic()
        row_bytes = self.geometry.row_stride if self.geometry else 0
        job = self._promotions.pop(job_id, None)
        if job is not None:
            result = PromotionResult.COMPLETED if success else PromotionResult.FAILED
            self.rec.inc(signals.PROMOTIONS, (result.value,), len(job.keys))
            direction = Direction.DISK_TO_CPU
            if success:
                self._digest_promoted(job)
            if self._tracing:
                with self.tracer.start_as_current_span(signals.SPAN_PROMOTION) as span:
                    span.set_attribute(signals.A_TIER, job.tier)
                    span.set_attribute(signals.A_ROW_COUNT, len(job.rows))
                    span.set_attribute(signals.A_SUCCESS, success)
                    span.set_attribute(signals.A_DURATION_S, now - job.started)
        else:
            job = self._cascades.pop(job_id, None)
            if job is None:
                return
            result = (signals.CascadeResult.COMPLETED if success
                      else signals.CascadeResult.FAILED)
            self.rec.inc(signals.CASCADES, (result.value,), len(job.keys))
            direction = Direction.CPU_TO_DISK
        if success:
            labels = (signals.RANK_MANAGER, direction.value)
            self.rec.inc(signals.TRANSFER_BYTES, labels, len(job.rows) * row_bytes)
            self.rec.observe(signals.TRANSFER_SECONDS, labels, now - job.started)

    # ---- promoted-row checksums --------------------------------------------
    def _digest_promoted(self, job: _TierJob) -> None:
        if self.checksum_policy == ChecksumPolicy.OFF or self._view is None or not self.geometry:
            return
        g = self.geometry
        with self.rec.guard(ErrorSite.CHECKSUM):
            for key, row in zip(job.keys, job.rows):
                start = row * g.row_stride
                self._expected[key] = (row, digest_slots(
                    self._view[start:start + g.row_stride], g.slot_size, g.world_size))
            if len(self._expected) > 2 * g.rows:  # bound: at most rows are live anyway
                for stale in list(self._expected)[: len(self._expected) - 2 * g.rows]:
                    del self._expected[stale]

    def _forget(self, keys) -> None:
        if self._expected or self.quarantine:
            for key in keys or ():
                self._expected.pop(key, None)
                self.quarantine.pop(key, None)

    def on_prepare_load(self, keys, spec) -> None:
        if not self._expected:
            return
        with self.rec.guard(ErrorSite.CHECKSUM):
            rows = compat.spec_rows(spec)
            expected = {}
            for key, row in zip(keys, rows):
                hit = self._expected.get(key)
                if hit is not None and hit[0] == row:
                    expected[row] = hit[1]
            if expected:  # only checked loads can be refused: remember their keys
                setattr(spec, compat.EXPECTED_DIGESTS_ATTR, expected)
                self._load_keys[id(spec)] = list(keys)

    def on_prepare_store(self, out) -> None:
        with self.rec.guard(ErrorSite.MANAGER):
            if out is None:
                self.rec.inc(signals.STORE_JOBS, (signals.StoreJobResult.NO_SPACE.value,))
            elif out.keys_to_store:
                self.rec.inc(signals.STORE_JOBS, (signals.StoreJobResult.PREPARED.value,))
                self._forget(out.evicted_keys)
                self._forget(out.keys_to_store)

    # ---- lookup rounds --------------------------------------------------------
    def on_lookup(self, key: bytes, result: Any, quarantined: bool = False) -> None:
        # Hot path (once per key looked up): count raw pairs, label them per step.
        try:
            pair = (key[-compat.GROUP_SUFFIX_BYTES:], result)
            counts = self._lookup_counts
            counts[pair] = counts.get(pair, 0) + 1
            rnd = self._round
            if rnd is not None:
                rnd.raw[pair] = rnd.raw.get(pair, 0) + 1
                if result is _MISS:  # at most once per group per scan
                    rnd.on_miss(pair[0], key, quarantined)
                else:
                    rnd.found.add(key)
        except Exception as exc:
            self.rec.error(ErrorSite.LOOKUP, exc)

    def _flush_lookups(self) -> None:
        counts, self._lookup_counts = self._lookup_counts, {}
        for (suffix, result), n in counts.items():
            self.rec.inc(signals.LOOKUPS, (str(int.from_bytes(suffix, "big")),
                                           compat.LOOKUP_RESULT[result].value), n)

    def begin_round(self) -> None:
        self._round = Round(time.time_ns())

    def end_round(self, request: Any, num_tokens: int | None, num_computed: int = 0) -> None:
        rnd, self._round = self._round, None
        if rnd is None:
            return
        cov = None
        with self.rec.guard(ErrorSite.ROUND):
            verdict = rnd.verdict(num_tokens)
            if verdict is not Verdict.DEFERRED:
                with self.rec.guard(ErrorSite.ROUND):  # its own guard: the verdict still counts
                    cov = self._coverage(rnd, verdict, request, num_tokens or 0, num_computed)
            labels = _VERDICT_LABELS[verdict]
            self.rec.inc(signals.LOOKUP_ROUNDS, labels)
            at_ceiling = False
            pending = 0
            rows_total = 0
            if verdict is Verdict.VETOED or verdict is Verdict.DEFERRED:
                pending = rnd.pending_keys
                rows_total = compat.row_states(self.primary)[0]
                self.rec.observe(signals.ROUND_PENDING_KEYS, (), pending)
                self.rec.set(signals.LAST_ROUND_PENDING_KEYS, labels, pending)
                self.rec.set(signals.LAST_ROUND_REQUEST_KEYS, labels,
                             self._request_keys(request))
                at_ceiling = rnd.at_row_ceiling(rows_total)
                if at_ceiling:
                    self.rec.inc(signals.ROUNDS_AT_ROW_CEILING, labels)
            if verdict is Verdict.HIT:
                self.rec.inc(signals.HIT_TOKENS, (), num_tokens or 0)
            req_id = getattr(request, "request_id", "")
            if req_id not in self._need:
                self._need[req_id] = self._request_keys(request)
            self._looked_up.add(req_id)
            self._requests.set(req_id, RequestState.DEFERRED if verdict is Verdict.DEFERRED
                               else RequestState.QUEUED, known_only=True)
            if not self._tracing:
                return
            span = self.tracer.start_span(signals.SPAN_LOOKUP_ROUND, start_time=rnd.started_ns)
            if span.is_recording():
                if not rows_total:
                    rows_total = compat.row_states(self.primary)[0]
                    pending = rnd.pending_keys
                groups = range(max(rnd.per_group, default=-1) + 1)
                for i, res in enumerate(_RESULTS):
                    span.set_attribute(signals.A_GROUP_RESULT_PREFIX + res.value,
                                       [rnd.per_group.get(g, [0] * len(_RESULTS))[i]
                                        for g in groups])
                span.set_attribute(signals.A_VERDICT, verdict.value)
                span.set_attribute(signals.A_REQUEST_ID_HASH, request_id_hash(req_id))
                span.set_attribute(signals.A_HIT_TOKENS, num_tokens or 0)
                span.set_attribute(signals.A_PENDING_KEYS, pending)
                span.set_attribute(signals.A_PRIMARY_ROWS, rows_total)
                span.set_attribute(signals.A_AT_ROW_CEILING, at_ceiling)
                if cov is not None:
                    span.set_attribute(signals.A_HELD_TOKENS, cov.held)
                    if cov.reason is not None:
                        span.set_attribute(signals.A_SHORT_REASON, cov.reason.value)
            span.end()

    def _coverage(self, rnd: Round, verdict: Verdict, request: Any, offered: int,
                  num_computed: int) -> Coverage | None:
        """Held vs offered tokens of an ended round, recorded (once per round, not per key)."""
        req_id = getattr(request, "request_id", "")
        keys = compat.request_offload_keys(self.cs, req_id)
        if not keys:
            return None
        cov = judge(first_miss=rnd.first_miss, scanned={s for s, _ in rnd.raw},
                    verdict=verdict, offered=offered, num_computed=num_computed,
                    groups=self._groups, keys_by_group=keys, manager=self.cs.manager)
        if cov is None:
            return None
        rec = self.rec
        if cov.held > 0:
            rec.inc(signals.RESTORE_HELD_TOKENS, (), cov.held)
            rec.observe(signals.RESTORE_COVERAGE, (), cov.offered / cov.held)
        if cov.reason is None:
            return cov
        label = _REASON_LABELS[cov.reason]
        rec.inc(signals.RESTORE_SHORT_ROUNDS, label)
        if cov.held > cov.offered:
            rec.inc(signals.RESTORE_SHORT_TOKENS, label, cov.held - cov.offered)
        if cov.want > cov.held:
            rec.inc(signals.RESTORE_SHORT_TOKENS, _NOT_STORED, cov.want - cov.held)
        if cov.refused and cov.held > cov.offered:  # rare: the row ceiling cut this restore
            others = [r for r, st in self._requests.state.items()
                      if st in _RESTORING and r != req_id]
            rec.set(signals.LAST_CEILING_OFFERED_TOKENS, (), cov.offered)
            rec.set(signals.LAST_CEILING_HELD_TOKENS, (), cov.held)
            rec.set(signals.LAST_CEILING_ROWS_NEEDED, (), cov.rows_needed)
            rec.set(signals.LAST_CEILING_CONCURRENT_REQUESTS, (), 1 + len(others))
            rec.set(signals.LAST_CEILING_CONCURRENT_ROWS, (),
                    cov.rows_needed + sum(self._need.get(r, 0) for r in others))
        return cov

    def _request_keys(self, request: Any) -> int:
        tokens = int(getattr(request, "num_tokens", 0) or 0)
        per_chunk = compat.blocks_per_chunk(self.spec)
        return sum(tokens // (tpb * per_chunk)
                   for tpb in compat.group_tokens_per_block(self.spec) if tpb)

    # ---- request lifecycle ------------------------------------------------------
    def on_new_request(self, request: Any) -> None:
        with self.rec.guard(ErrorSite.STEP):
            self._requests.set(request.request_id, RequestState.QUEUED)

    def after_alloc(self, request: Any, num_external_tokens: int) -> None:
        with self.rec.guard(ErrorSite.STEP):
            self._requests.set(request.request_id, RequestState.LOADING if num_external_tokens
                               else RequestState.RUNNING, known_only=True)

    def on_finished(self, request: Any) -> None:
        with self.rec.guard(ErrorSite.STEP):
            self._requests.drop(request.request_id)
            self._need.pop(request.request_id, None)

    def close(self) -> None:
        """Drop buffer exports so vLLM can close the primary tier's mmap."""
        if self._view is not None:
            self._view.release()
            self._view = None

    def on_meta(self, meta: Any) -> None:
        """Remember which keys each checked load job covers (for refusals)."""
        if not self._load_keys:
            return
        with self.rec.guard(ErrorSite.CHECKSUM):
            for job_id, job in (getattr(meta, "load_jobs", None) or {}).items():
                keys = self._load_keys.pop(id(job.src_spec), None)
                if keys is not None:
                    self._load_jobs[job_id] = (set(compat.spec_rows(job.dst_spec)), keys,
                                               load_failures.load_job_request(job))
            self._load_keys.clear()

    def on_connector_output(self, output: Any) -> None:
        if not self._load_jobs:
            return
        with self.rec.guard(ErrorSite.CHECKSUM):
            invalid = set(getattr(output, "invalid_block_ids", None) or ())
            failed = load_failures.failed_requests(output)  # 0.33, several KV groups
            if invalid or failed:
                for job_id, (blocks, keys, req_id) in list(self._load_jobs.items()):
                    if blocks & invalid or req_id in failed:
                        self.quarantine.update(dict.fromkeys(keys))
                        del self._load_jobs[job_id]
            live = {jid for jid, _ in compat.connector_jobs(self.cs)}
            for job_id in [j for j in self._load_jobs if j not in live]:
                del self._load_jobs[job_id]
            limit = 2 * (self.geometry.rows if self.geometry else 1024)
            for stale in list(self.quarantine)[: max(len(self.quarantine) - limit, 0)]:
                del self.quarantine[stale]

    # ---- once per step ------------------------------------------------------------
    def on_step(self, scheduler_output: Any) -> None:
        with self.rec.guard(ErrorSite.LOOKUP):
            self._flush_lookups()
        with self.rec.guard(ErrorSite.STEP):
            self._update_requests(scheduler_output)
            # Gauges are snapshots for scrapes (seconds apart): refresh them at most
            # GAUGE_REFRESH_S apart while busy, and on every step of an idle engine
            # (cheap there, and the state an operator inspects afterwards).
            if time.monotonic() - self._gauges_at >= GAUGE_REFRESH_S or not self._requests:
                self._update_gauges()
            self.rec.inc(signals.SCHEDULER_STEPS)
            now = time.time()
            if now - self._stamped >= TIMESTAMP_RESOLUTION_S:  # seconds suffice for staleness
                self._stamped = now
                self.rec.set(signals.LAST_STEP_TIMESTAMP, (), now)
                self._tracing = tracing_enabled(self.tracer)  # a provider may appear later
        with self.rec.guard(ErrorSite.STATS):
            self.rec.flush()

    def refresh(self) -> None:
        """Recompute the gauges and flush now (an idle engine, a harness, a test)."""
        with self.rec.guard(ErrorSite.STEP):
            self._update_gauges()
        with self.rec.guard(ErrorSite.STATS):
            self.rec.flush()

    def _update_requests(self, so: Any) -> None:
        # A deferred request is asked again every step it can be admitted; one
        # not asked this step sits behind capacity (queued), not behind us.
        for rid in [r for r in self._requests.deferred if r not in self._looked_up]:
            self._requests.set(rid, RequestState.QUEUED)
        self._looked_up.clear()
        for rid in getattr(so, "num_scheduled_tokens", {}) or {}:
            self._requests.set(rid, RequestState.RUNNING, known_only=True)
        for rid in getattr(so, "preempted_req_ids", None) or ():
            self._requests.set(rid, RequestState.QUEUED, known_only=True)

    def _update_gauges(self) -> None:
        now = self._gauges_at = time.monotonic()
        total, occupied, in_flight = compat.row_states(self.primary)
        self.rec.set(signals.PRIMARY_ROWS, _ROW_LABELS[RowState.TOTAL], total)
        self.rec.set(signals.PRIMARY_ROWS, _ROW_LABELS[RowState.OCCUPIED], occupied)
        self.rec.set(signals.PRIMARY_ROWS, _ROW_LABELS[RowState.IN_FLIGHT], in_flight)

        started: dict[PendingKind, list[float]] = {k: [] for k in PendingKind}
        live = set()
        for jid, is_store in compat.connector_jobs(self.cs):
            live.add(jid)
            first = self._job_first_seen.setdefault(jid, now)
            started[PendingKind.STORE if is_store else PendingKind.LOAD].append(first)
        for jid in [j for j in self._job_first_seen if j not in live]:
            del self._job_first_seen[jid]
        started[PendingKind.PROMOTION] = [j.started for j in self._promotions.values()]
        started[PendingKind.CASCADE] = [j.started for j in self._cascades.values()]
        for kind, times in started.items():
            self.rec.set(signals.PENDING_TRANSFERS, _KIND_LABELS[kind], len(times))
            self.rec.set(signals.OLDEST_PENDING_TRANSFER, _KIND_LABELS[kind],
                         now - min(times) if times else 0.0)

        for state, n in self._requests.counts.items():
            self.rec.set(signals.REQUESTS, _STATE_LABELS[state], n)
        self.rec.set(signals.REQUESTS_IN_FLIGHT, (), len(self._requests))
        self.rec.set(signals.QUARANTINED_KEYS, (), len(self.quarantine))
        self._update_info(total)

    def _update_info(self, rows_total: int) -> None:
        from vllm.v1.core import kv_cache_utils

        src = getattr(kv_cache_utils, "NONE_HASH", None)
        if self._static_done and src is self._fingerprint_src:
            return
        self._fingerprint_src = src
        tiers = "+".join(["cpu", *(compat.tier_type(t) for t in self.tiers)])
        tpb = compat.group_tokens_per_block(self.spec)
        chunk_tokens = (tpb[0] if tpb else 0) * compat.blocks_per_chunk(self.spec)
        batched = getattr(getattr(self.vllm_config, "scheduler_config", None),
                          "max_num_batched_tokens", "")
        self.rec.replace_gauge(signals.INFO, {(
            __version__, compat.VLLM_VERSION, type(self.spec).__name__, tiers,
            str(rows_total), compat.hash_fingerprint(self.vllm_config), self.checksum_policy,
            str(chunk_tokens), str(batched)): 1.0})
        if self.geometry is not None:
            self.rec.set(signals.PRIMARY_ROW_BYTES, (), self.geometry.row_stride)
        if not self._static_done:
            kinds = compat.kv_group_kinds(self.kv_cache_config)
            self.rec.replace_gauge(signals.KV_GROUP_INFO, {
                (str(g), kind, str(tpb[g] if g < len(tpb) else 0)): 1.0
                for g, kind in enumerate(kinds)})
            self._static_done = True


def bracket(observer: SchedulerObserver | None, fn: Callable[[], tuple[int | None, bool]],
            request: Any, num_computed_tokens: int = 0) -> tuple[int | None, bool]:
    """Run one get_num_new_matched_tokens call inside a lookup round."""
    if observer is None:
        return fn()
    observer.begin_round()
    result = fn()
    observer.end_round(request, result[0], num_computed_tokens)
    return result
