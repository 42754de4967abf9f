"""The typed evidence model: what kv-diagnose knows about one incident window.

:func:`kvscope.diagnostics.evidence.build.build_evidence` fills it from any source
(what each field is read from: :mod:`.read_table`); classifiers read only
:class:`Evidence`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.exporters import signals as S

from ..model import ABSENT, Quantity, SourceInfo
from .targets import TargetInfo


def _q(d: dict[str, Quantity], key: str) -> Quantity:
    return d.get(key, ABSENT)


@dataclass(frozen=True)
class GroupLookups:
    group: str
    results: dict[str, Quantity]  # LookupResult value -> lookups
    # ShortReason value -> rounds cut short where this group's scan stopped the offer
    stopped: dict[str, Quantity] = field(default_factory=dict)
    # this group's store-job keys: StoreKeyResult value -> keys; the tokens and bytes its
    # stored keys cover; its keys evicted by stores; its keys in the primary tier (latest)
    stores: dict[str, Quantity] = field(default_factory=dict)
    store_tokens: Quantity = ABSENT
    store_bytes: Quantity = ABSENT
    evicted: Quantity = ABSENT
    primary_keys: Quantity = ABSENT

    def get(self, result: S.LookupResult) -> Quantity:
        return _q(self.results, result.value)

    def store(self, result: S.StoreKeyResult) -> Quantity:
        return _q(self.stores, result.value)

    def stops(self, reason: S.ShortReason) -> Quantity:
        return _q(self.stopped, reason.value)

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
    # per secondary tier (the tier probe's series): keys lost, start-up directory present
    # (min over targets: gone on any), the latest loss's Unix time (max over targets)
    lost_keys: dict[str, Quantity] = field(default_factory=dict)
    root_present: dict[str, Quantity] = field(default_factory=dict)
    last_loss: dict[str, Quantity] = field(default_factory=dict)
    # RankCheck value -> worker ranks whose promoted rows are digested / that map the
    # scheduler's own region file (kvscope_checksum_ranks, summed over engines)
    checksum_ranks: dict[str, Quantity] = field(default_factory=dict)

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
class RestoreTime:
    """Where restores' time went (``kvscope_restore_*``, restore_clock.py): seconds per phase
    summed over the restores that ended, their count and seconds, and their deferred
    rescans (the rounds vLLM asked again) with the keys those looked up."""

    phases: dict[str, Quantity] = field(default_factory=dict)  # RestorePhase value
    restores: Quantity = ABSENT  # the duration histogram's _count
    seconds: Quantity = ABSENT  # its _sum
    rescans: Quantity = ABSENT
    rescan_keys: Quantity = ABSENT

    def phase(self, phase: S.RestorePhase) -> Quantity:
        return _q(self.phases, phase.value)


@dataclass(frozen=True)
class RestoreCoverage:
    """Held vs offered tokens of ended lookup rounds (``kvscope_restore_*``), and the
    latest round a promotion without a free row cut short (``kvscope_last_ceiling_round_*``)."""

    held_tokens: Quantity = ABSENT
    # ended rounds whose request the tiers held at least one chunk of (the coverage
    # histogram's _count): the restores held_tokens is summed over
    held_rounds: Quantity = ABSENT
    short_rounds: dict[str, Quantity] = field(default_factory=dict)  # ShortReason value
    short_tokens: dict[str, Quantity] = field(default_factory=dict)  # ShortReason value
    ceiling_rounds: dict[str, Quantity] = field(default_factory=dict)  # CeilingForm value
    ceiling_offered: Quantity = ABSENT
    ceiling_held: Quantity = ABSENT
    ceiling_rows_needed: Quantity = ABSENT
    ceiling_concurrent_requests: Quantity = ABSENT
    # the histogram of it, one observation per cut round: le -> cumulative count
    ceiling_concurrent_buckets: dict[str, Quantity] = field(default_factory=dict)
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
class Settling:
    """Whether an idle engine settled: vLLM's GPU block pool (``kvscope_gpu_blocks``, and
    what the latest step that left nothing in flight left in use:
    ``kvscope_idle_gpu_blocks_in_use``) and the host's memory beside the engine process's."""

    gpu_blocks: dict[str, Quantity] = field(default_factory=dict)  # GpuBlockState value
    idle_gpu_blocks: Quantity = ABSENT
    host_available: Quantity = ABSENT  # min over targets: the tightest host
    process_resident: Quantity = ABSENT  # summed over the engines' processes

    def blocks(self, state: S.GpuBlockState) -> Quantity:
        return _q(self.gpu_blocks, state.value)


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
    restore_time: RestoreTime = field(default_factory=RestoreTime)
    # (target, model_name, engine) -> worker ranks its worker-side series name; ("", "", "")
    # holds those without vLLM's engine label (standalone exporters: one target per rank)
    rank_scopes: dict[tuple[str, str, str], frozenset[str]] = field(default_factory=dict)
    settling: Settling = field(default_factory=Settling)
    # VllmFault value -> calls kvscope answered where the installed vLLM would have raised
    vllm_faults: dict[str, Quantity] = field(default_factory=dict)
    # KV group -> how vLLM keys it for an EAGLE/MTP drafter (DrafterKeys value; groups of a
    # kvscope that exports no drafter label are absent)
    kv_group_drafters: dict[str, str] = field(default_factory=dict)
    # KV group -> the most chunks of it one restore from a secondary tier promotes (0: every
    # chunk of the prefix; groups of a kvscope that exports no restore_chunks are absent)
    kv_group_restore_chunks: dict[str, int] = field(default_factory=dict)

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

    def group_kind(self, group: str) -> str:
        """The attention kind ``kvscope_kv_group_info`` gives a KV group ("" unknown)."""
        return self.kv_groups.get(group, ("", ""))[0]

    def group_tokens_per_block(self, group: str) -> int | None:
        try:
            return int(self.kv_groups.get(group, ("", ""))[1])
        except ValueError:
            return None

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

    def stopping_groups(self, reason: S.ShortReason) -> list[tuple[str, str, float]]:
        """(group, attention kind, rounds) of the KV groups whose scan stopped rounds cut
        short for ``reason`` over the window, most rounds first (empty: none told, e.g. an
        input from a kvscope that did not export kvscope_restore_stopped_rounds_total)."""
        out = [(g, self.kv_groups.get(g, ("", ""))[0], q.increase)
               for g, lk in self.lookups.items() if (q := lk.stops(reason)).increase > 0]
        return sorted(out, key=lambda t: -t[2])

    def lookups_total(self, result: S.LookupResult) -> float:
        return sum(g.get(result).increase for g in self.lookups.values())
