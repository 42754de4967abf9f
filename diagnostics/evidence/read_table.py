"""What each evidence field is read from: one row per field, no statements.

A :class:`Read` names the series, the label whose values key the field (a
``dict`` of Quantities) or none (one Quantity), and how series are combined:
``sum`` (counters and counts, summed over targets and ranks), ``max``
(latest-value gauges and timestamps, where a sum would mean nothing) or ``min``
(presence flags: absent on one target is absent).
:func:`kvscope.diagnostics.evidence.build.build_evidence` applies the tables; a new
evidence field is a new row here and a field in :mod:`.model`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from .model import (
    Freshness,
    GroupLookups,
    Pending,
    RankTransfers,
    Requests,
    RestoreCoverage,
    RestoreTime,
    Rounds,
    Settling,
    Tiers,
    Vllm,
)


@dataclass(frozen=True)
class Read:
    series: S.Metric | str
    by: str = ""  # label whose values key the field; "" = one Quantity
    how: str = "sum"  # "sum" | "max" | "min" over the series

    @property
    def name(self) -> str:
        return self.series.name if isinstance(self.series, S.Metric) else self.series


MAX = "max"
MIN = "min"  # a presence flag: 0 on any target reads 0

# Parts of the Evidence read straight from series (the Evidence field -> its part's rows)
PARTS: dict[str, tuple[type, dict[str, Read]]] = {
    "rounds": (Rounds, {
        "verdicts": Read(S.LOOKUP_ROUNDS, S.L_VERDICT),
        "at_ceiling": Read(S.ROUNDS_AT_ROW_CEILING, S.L_VERDICT),
        "last_pending_keys": Read(S.LAST_ROUND_PENDING_KEYS, S.L_VERDICT, MAX),
        "hit_tokens": Read(S.HIT_TOKENS),
        "last_request_keys": Read(S.LAST_ROUND_REQUEST_KEYS, S.L_VERDICT, MAX),
    }),
    "tiers": (Tiers, {
        "rows": Read(S.PRIMARY_ROWS, S.L_STATE),
        "promotions": Read(S.PROMOTIONS, S.L_RESULT),
        "cascades": Read(S.CASCADES, S.L_RESULT),
        "store_jobs": Read(S.STORE_JOBS, S.L_RESULT),
        "row_bytes": Read(S.PRIMARY_ROW_BYTES, how=MAX),
        "quarantined_keys": Read(S.QUARANTINED_KEYS),
        "lost_keys": Read(S.TIER_LOST_KEYS, S.L_TIER),
        "root_present": Read(S.TIER_ROOT_PRESENT, S.L_TIER, MIN),
        "last_loss": Read(S.TIER_LAST_LOSS_TIMESTAMP, S.L_TIER, MAX),
        "checksum_ranks": Read(S.CHECKSUM_RANKS, S.L_CHECK),
    }),
    "pending": (Pending, {
        "transfers": Read(S.PENDING_TRANSFERS, S.L_KIND),
        "oldest_seconds": Read(S.OLDEST_PENDING_TRANSFER, S.L_KIND, MAX),
    }),
    "requests": (Requests, {
        "states": Read(S.REQUESTS, S.L_STATE),
        "in_flight": Read(S.REQUESTS_IN_FLIGHT),
        "vllm_running": Read(S.VLLM_REQUESTS_RUNNING),
        "vllm_waiting": Read(S.VLLM_REQUESTS_WAITING),
        "vllm_waiting_by_reason": Read(S.VLLM_REQUESTS_WAITING_BY_REASON, S.L_REASON),
        "vllm_queue_time_sum": Read(S.VLLM_REQUEST_QUEUE_TIME + "_sum"),
        "vllm_queue_time_count": Read(S.VLLM_REQUEST_QUEUE_TIME + "_count"),
    }),
    "vllm": (Vllm, {
        "external_queries": Read(S.VLLM_EXTERNAL_PREFIX_QUERIES),
        "external_hits": Read(S.VLLM_EXTERNAL_PREFIX_HITS),
        "offload_load_bytes": Read(S.VLLM_OFFLOAD_LOAD_BYTES),
        "offload_store_bytes": Read(S.VLLM_OFFLOAD_STORE_BYTES),
    }),
    "coverage": (RestoreCoverage, {
        "held_tokens": Read(S.RESTORE_HELD_TOKENS),
        "held_rounds": Read(S.RESTORE_COVERAGE.name + "_count"),
        "short_rounds": Read(S.RESTORE_SHORT_ROUNDS, S.L_REASON),
        "short_tokens": Read(S.RESTORE_SHORT_TOKENS, S.L_REASON),
        "ceiling_rounds": Read(S.RESTORE_CEILING_ROUNDS, S.L_FORM),
        "ceiling_offered": Read(S.LAST_CEILING_OFFERED_TOKENS, how=MAX),
        "ceiling_held": Read(S.LAST_CEILING_HELD_TOKENS, how=MAX),
        "ceiling_rows_needed": Read(S.LAST_CEILING_ROWS_NEEDED, how=MAX),
        "ceiling_concurrent_requests": Read(S.LAST_CEILING_CONCURRENT_REQUESTS, how=MAX),
        "ceiling_concurrent_buckets": Read(S.CEILING_CONCURRENT_REQUESTS.name + "_bucket", "le"),
        "ceiling_concurrent_rows": Read(S.LAST_CEILING_CONCURRENT_ROWS, how=MAX),
    }),
    "restore_time": (RestoreTime, {
        "phases": Read(S.RESTORE_PHASE_SECONDS, S.L_PHASE),
        "restores": Read(S.RESTORE_DURATION.name + "_count"),
        "seconds": Read(S.RESTORE_DURATION.name + "_sum"),
        "rescans": Read(S.RESTORE_RESCANS),
        "rescan_keys": Read(S.RESTORE_RESCAN_KEYS),
    }),
    "settling": (Settling, {
        "gpu_blocks": Read(S.GPU_BLOCKS, S.L_STATE),
        "idle_gpu_blocks": Read(S.IDLE_GPU_BLOCKS),
        "host_available": Read(S.HOST_MEMORY_AVAILABLE, how=MIN),
        "process_resident": Read(S.PROCESS_RESIDENT_MEMORY),
    }),
}

# Evidence fields that are one Read themselves
FIELDS: dict[str, Read] = {
    "telemetry_errors": Read(S.TELEMETRY_ERRORS, S.L_WHERE),
    "vllm_faults": Read(S.VLLM_FAULTS_CONTAINED, S.L_FAULT),
}


@dataclass(frozen=True)
class Split:
    """A part read once per value of ``label`` (its series filtered to that value
    first): ``key`` is the part's field that holds the value."""

    label: str
    part: type
    key: str
    rows: dict[str, Read]
    # values of ``label`` whose parts legitimately lack series the others have
    exempt: tuple[str, ...] = ()


# Evidence.lookups: one GroupLookups per KV group (its lookups, and its stores)
LOOKUPS = Split(S.L_KV_GROUP, GroupLookups, "group", {
    "results": Read(S.LOOKUPS, S.L_RESULT),
    "stopped": Read(S.RESTORE_STOPPED_ROUNDS, S.L_REASON),
    "stores": Read(S.STORE_KEYS, S.L_RESULT),
    "store_tokens": Read(S.STORE_TOKENS),
    "store_bytes": Read(S.STORE_BYTES),
    "evicted": Read(S.EVICTED_KEYS),
    "primary_keys": Read(S.PRIMARY_KEYS),
})
# Evidence.ranks: one RankTransfers per rank (worker ranks and "manager")
RANKS = Split(S.L_RANK, RankTransfers, "rank", {
    "bytes": Read(S.TRANSFER_BYTES, S.L_DIRECTION),
    "in_flight": Read(S.TRANSFERS_IN_FLIGHT, S.L_DIRECTION),
    "checksums": Read(S.ROW_CHECKSUMS, S.L_OUTCOME),
    "refused": Read(S.LOADS_REFUSED, S.L_REASON),
    "last_report": Read(S.WORKER_LAST_STEP_TIMESTAMP, how=MAX),
}, exempt=(S.RANK_MANAGER,))  # the manager moves disk rows: no checksums, no refusals

# Evidence.freshness: steps from the table; last_step is one max per target
# (model and engine labels kept apart), now is the source's clock.
FRESHNESS = (Freshness, {"steps": Read(S.SCHEDULER_STEPS)})
LAST_STEP = Read(S.LAST_STEP_TIMESTAMP, how=MAX)
