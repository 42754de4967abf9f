"""The kvscope signal contract: every metric, label, label value and span name.

Everything else in kvscope (the connector, the exporters, the dashboards and
rules, kv-diagnose) imports names from here and never re-spells them. A name
change is a change to this file and to the golden ``/metrics`` fixture.

Conventions (Prometheus naming): one ``kvscope_`` prefix, no colons, base
units spelled in the name (``_seconds``, ``_bytes``), ``_total`` on counters
only. Labels are bounded: no request ids, no block hashes, no prompt text.

The same names appear on both export paths:

* vLLM's own ``/metrics`` (through the connector stats pipeline), where vLLM
  adds its ``model_name`` and ``engine`` labels in front of ours;
* the standalone kvscope exporter (one process or rank), without them.

The contract is the same on every supported vLLM release (0.26.0 .. 0.33.0):
same names, labels and label values. Where vLLM's own semantics moved, the
signals keep their meaning and the difference is written beside them:

* A tiering lookup that starts a promotion answers ``retry`` in vLLM 0.26 and
  ``hit_pending`` in 0.33 (``kvscope_lookups_total{result}`` shows which).
  Both count as pending keys: they feed ``verdict="deferred"``, the pending-key
  histogram and gauge, and the row-ceiling counter alike.
* The row ceiling's "rows ran out": vLLM 0.26 refuses the promotion
  (``kvscope_promotions_total{result="no_row"}``); 0.33 no longer touches rows
  on lookup, so the promotion evicts a row the same round had just found.
* A refused load reaches vLLM's ``kv_load_failure_policy`` per block (one KV
  group), or on 0.33 with several groups per request (``failed_recving``);
  0.26 with several groups cannot recompute safely: ``checksum_policy`` falls
  back to ``observe`` (``kvscope_info{checksum_policy}`` says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

PREFIX = "kvscope_"


class Kind(str, Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


# --------------------------------------------------------------------------
# Label names
# --------------------------------------------------------------------------
L_KV_GROUP = "kv_group"
L_RESULT = "result"
L_VERDICT = "verdict"
L_STATE = "state"
L_KIND = "kind"
L_WHERE = "where"
L_RANK = "rank"
L_DIRECTION = "direction"
L_OUTCOME = "outcome"
L_REASON = "reason"
L_FORM = "form"
L_TIER = "tier"
L_TOKENS_PER_BLOCK = "tokens_per_block"
L_DRAFTER = "drafter"
L_RESTORE_CHUNKS = "restore_chunks"
L_PHASE = "phase"
L_PREFIX = "prefix"
L_KVSCOPE_VERSION = "kvscope_version"
L_VLLM_VERSION = "vllm_version"
L_SPEC = "spec"
L_TIERS = "tiers"
L_PRIMARY_ROWS = "primary_rows"
L_HASH_SEED = "hash_seed"
L_CHECKSUM_POLICY = "checksum_policy"
L_CHUNK_TOKENS = "chunk_tokens"
L_MAX_BATCHED_TOKENS = "max_num_batched_tokens"
L_WORLD_SIZE = "world_size"
L_CHECK = "check"
L_FAULT = "fault"

# Labels vLLM's stats pipeline puts in front of ours on its /metrics.
VLLM_LABEL_MODEL = "model_name"
VLLM_LABEL_ENGINE = "engine"


# --------------------------------------------------------------------------
# Label values (closed sets; anything else is a bug)
# --------------------------------------------------------------------------
class LookupResult(str, Enum):
    """What ``OffloadingManager.lookup`` answered for one key.

    After starting a promotion a tiering lookup answers RETRY in vLLM 0.26 and
    HIT_PENDING in 0.33; both are pending keys (see the module docstring)."""

    HIT = "hit"
    MISS = "miss"
    RETRY = "retry"
    HIT_PENDING = "hit_pending"


class Verdict(str, Enum):
    """What one ``get_num_new_matched_tokens`` call decided for a request."""

    HIT = "hit"  # > 0 tokens to load
    DEFERRED = "deferred"  # None: ask again next step
    VETOED = "vetoed"  # 0, although some group found hit/retry/hit_pending keys
    MISS = "miss"  # 0 and nothing found


class RowState(str, Enum):
    TOTAL = "total"
    OCCUPIED = "occupied"
    IN_FLIGHT = "in_flight"  # held by running writes / promotions


class GpuBlockState(str, Enum):
    """vLLM's GPU KV-cache block pool (its null block left out)."""

    TOTAL = "total"
    IN_USE = "in_use"  # held by a request or pinned; prefix-cached blocks no one holds are free


class PromotionResult(str, Enum):
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    NO_ROW = "no_row"  # primary tier full: no evictable row for the promotion


class CascadeResult(str, Enum):
    """Primary -> secondary tier writes (what reaches the disk tier)."""

    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"


class StoreJobResult(str, Enum):
    PREPARED = "prepared"
    NO_SPACE = "no_space"  # prepare_store refused: one step's store job > tier


class StoreKeyResult(str, Enum):
    """What became of one key of a store job (``kvscope_store_keys_total{result}``)."""

    STORED = "stored"  # written into the primary tier (with tiering: cascaded to every tier)
    HELD = "held"  # not written: the primary tier held it already (or vLLM's store threshold
    # skipped it)
    NO_SPACE = "no_space"  # its job was refused (prepare_store: no free row): reaches no tier


class PendingKind(str, Enum):
    LOAD = "load"  # connector load jobs not yet reported by every rank
    STORE = "store"  # connector store jobs not yet reported by every rank
    PROMOTION = "promotion"  # secondary -> primary tier jobs in flight
    CASCADE = "cascade"  # primary -> secondary tier jobs in flight


class RequestState(str, Enum):
    """Requests as the connector sees them (not vLLM's own queue metrics)."""

    QUEUED = "queued"  # known, not allocated, last round (if any) not deferred
    DEFERRED = "deferred"  # last lookup round returned None
    LOADING = "loading"  # allocated, waiting for a load job
    RUNNING = "running"  # allocated, computing


class Direction(str, Enum):
    GPU_TO_CPU = "gpu_to_cpu"
    CPU_TO_GPU = "cpu_to_gpu"
    DISK_TO_CPU = "disk_to_cpu"
    CPU_TO_DISK = "cpu_to_disk"


class ChecksumOutcome(str, Enum):
    MATCH = "match"
    MISMATCH = "mismatch"


class RankCheck(str, Enum):
    """How a rank's copy of promoted rows is checked (connector/integrity/shared_region.py)."""

    DIGESTED = "digested"  # compared with the scheduler's digests before each load
    SHARED_REGION = "shared_region"  # maps the scheduler's own file: reads the very bytes


class RefusalReason(str, Enum):
    CHECKSUM_MISMATCH = "checksum_mismatch"
    CHECKSUM_ERROR = "checksum_error"  # the rank could not read its own slot


class DrafterKeys(str, Enum):
    """How vLLM keys a KV group for speculative decoding (``drafter`` label of
    kvscope_kv_group_info)."""

    NONE = "none"  # not an EAGLE/MTP drafter's group
    # a drafter's group whose volatile trailing chunk vLLM drops (legacy hashes: vLLM before
    # 0.34, or 0.34 with lookahead hashes off): with a sliding window its lookup needs one
    # chunk more than it stores, so its miss vetoes every restore
    TAIL_DROPPED = "tail_dropped"
    LOOKAHEAD = "lookahead"  # keyed with the tokens after each block (vLLM 0.34): nothing dropped


class RestorePhase(str, Enum):
    """Where a restore's time went (``phase`` label of kvscope_restore_phase_seconds_total),
    from the request's first lookup round to the step that ran it with its KV loaded."""

    # the scheduler thread inside the request's deferred lookup rounds: vLLM asks again every
    # step until the tiers answer, each round looking up the prompt's keys anew
    DEFERRED_RESCANS = "deferred_rescans"
    # between rounds after one whose promotion found no free primary row
    WAITING_FOR_ROWS = "waiting_for_rows"
    # between rounds otherwise: the promotions the rounds started, read from a secondary tier
    TIER_READS = "tier_reads"
    # from vLLM's allocation for the offered tokens to the step that ran the request
    GPU_LOAD = "gpu_load"


class PrefixLength(str, Enum):
    """The restored prefix's length, bucketed (``prefix`` label of
    kvscope_restore_duration_seconds): bounded, so restore time reads against it."""

    UP_TO_16K = "le_16k"
    UP_TO_64K = "le_64k"
    UP_TO_256K = "le_256k"
    UP_TO_1M = "le_1m"
    OVER_1M = "gt_1m"


# (upper bound in tokens, bucket) in order; the last catches the rest
PREFIX_LENGTH_BOUNDS: tuple[tuple[int, PrefixLength], ...] = (
    (16_384, PrefixLength.UP_TO_16K), (65_536, PrefixLength.UP_TO_64K),
    (262_144, PrefixLength.UP_TO_256K), (1_048_576, PrefixLength.UP_TO_1M),
)


class ShortReason(str, Enum):
    """Why an ended lookup round offered fewer tokens than the request's whole
    loadable prefix (``reason`` label of the restore-coverage counters)."""

    ROW_CEILING = "row_ceiling"  # a tier held the next chunk; its promotion found no free row
    NOT_STORED = "not_stored"  # no tier holds the next chunk: the stored prefix ends there
    # ... and its store job was refused for lack of a primary row (prepare_store: no_space):
    # the prompt was stored only in part, its re-asks recompute the rest
    STORE_REFUSED = "store_refused"
    GROUP_VETO = "group_veto"  # another KV group missed, and the cross-group AND gave 0
    LOAD_CAP = "load_cap"  # vLLM loaded less than every group holds (its own load limits)
    OTHER = "other"  # e.g. keys kvscope answers MISS for (quarantined after a refused load)


class CeilingForm(str, Enum):
    """``form`` of ``kvscope_restore_ceiling_rounds_total``: whether the cut request's held
    prefix could fit the primary tier on its own."""

    ALONE = "alone"  # it needs more rows at once than the tier has: truncated whatever else runs
    CONCURRENT = "concurrent"  # it fits alone; rows pinned by other work at the time cut it


class VllmFault(str, Enum):
    """A vLLM bug kvscope contains (``fault`` label): the call vLLM would raise on is
    answered as vLLM's own quiet path instead (``connector/contained_faults.py``)."""

    # vLLM 0.26 (fixed in 0.27.0): a store prepared for a request whose tiering state
    # vLLM already deleted raises KeyError and kills the engine; kvscope skips that store
    STORE_AFTER_FINISH = "store_after_finish"


# Reasons where the tiers held no more than was offered, and the others: where they held more.
NOT_HELD: tuple[str, ...] = (ShortReason.NOT_STORED.value, ShortReason.STORE_REFUSED.value)
SHORT_OF_HELD: tuple[str, ...] = tuple(r.value for r in ShortReason if r.value not in NOT_HELD)


class ErrorSite(str, Enum):
    """Where the instrumentation swallowed an exception (``where`` label)."""

    LOOKUP = "lookup"
    ROUND = "round"
    MANAGER = "manager"
    TIER = "tier"
    STEP = "step"
    STATS = "stats"
    EXPORTER = "exporter"
    OTEL = "otel"
    WORKER = "worker"
    CHECKSUM = "checksum"
    TIER_PROBE = "tier_probe"  # the secondary-tier probe's own thread (tiers/probe.py)
    AGGREGATOR = "aggregator"  # kvscope's aggregator thread failed or fell behind (aggregator.py)


# ``rank`` label value for transfers made by the scheduler-side manager process
# (disk <-> CPU tier jobs touch every rank's slot of a row at once).
RANK_MANAGER = "manager"


# --------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)  # identity hash: signals are singletons
class Metric:
    name: str  # the series name as scraped (counters end in _total)
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    label_values: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def base(self) -> str:
        """Name without ``_total``: what a prometheus-client Counter is given."""
        return self.name[: -len("_total")] if self.kind is Kind.COUNTER else self.name


def _values(enum: type[Enum]) -> tuple[str, ...]:
    return tuple(m.value for m in enum)


# Pending-key sums per round: small counts, plus the sizes primary tiers come in.
# Offered / held tokens of one ended round: 1 is a full restore.
COVERAGE_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
PENDING_KEY_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)
# Restores at once when the row ceiling cut one: every count up to 16, then steps of at
# most a third (kv-diagnose plan sizes rows from the bucket bound, an over-estimate)
CONCURRENT_REQUEST_BUCKETS = (*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 160,
                              192, 256, 384, 512, 1024)
# Transfers of whole KV rows: milliseconds (a CPU->GPU DMA) to many seconds
# (a cold disk read under load).
TRANSFER_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)

# A restore: a CPU-tier hit in milliseconds to a million-token prefix promoted from disk
# in minutes
RESTORE_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                           300.0, 600.0)

LOOKUPS = Metric(
    "kvscope_lookups_total", Kind.COUNTER,
    "Offload manager lookup results per KV-cache group (one per key looked up).",
    (L_KV_GROUP, L_RESULT), label_values={L_RESULT: _values(LookupResult)},
)
LOOKUP_ROUNDS = Metric(
    "kvscope_lookup_rounds_total", Kind.COUNTER,
    "Lookup rounds (get_num_new_matched_tokens calls) by the verdict the cross-group AND reached.",
    (L_VERDICT,), label_values={L_VERDICT: _values(Verdict)},
)
ROUND_PENDING_KEYS = Metric(
    "kvscope_round_pending_keys", Kind.HISTOGRAM,
    "Retry plus hit_pending keys summed over KV groups, per vetoed or deferred lookup round.",
    buckets=PENDING_KEY_BUCKETS,
)
LAST_ROUND_PENDING_KEYS = Metric(
    "kvscope_last_round_pending_keys", Kind.GAUGE,
    "Exact pending-key sum (retry plus hit_pending over all groups) of the latest vetoed or "
    "deferred round (0 until the first one); compare with kvscope_primary_rows{state=\"total\"}.",
    (L_VERDICT,), label_values={L_VERDICT: (Verdict.VETOED.value, Verdict.DEFERRED.value)},
)
ROUNDS_AT_ROW_CEILING = Metric(
    "kvscope_rounds_at_row_ceiling_total", Kind.COUNTER,
    "Vetoed or deferred lookup rounds whose found keys reached the primary tier's row count "
    "while its promotions ran out of rows (vLLM 0.26: a promotion found no free row; 0.33: a "
    "promotion evicted a row the same round had found): the capacity-ceiling tell.",
    (L_VERDICT,), label_values={L_VERDICT: (Verdict.VETOED.value, Verdict.DEFERRED.value)},
)
HIT_TOKENS = Metric(
    "kvscope_hit_tokens_total", Kind.COUNTER,
    "Tokens the connector offered to load from the offload tiers (sum over hit rounds).",
)
PRIMARY_ROWS = Metric(
    "kvscope_primary_rows", Kind.GAUGE,
    "Rows of the CPU primary tier: total, occupied by a key, held by a running write or promotion.",
    (L_STATE,), label_values={L_STATE: _values(RowState)},
)
PROMOTIONS = Metric(
    "kvscope_promotions_total", Kind.COUNTER,
    "Secondary -> primary tier promotions (one per key), by result; no_row = primary tier full.",
    (L_RESULT,), label_values={L_RESULT: _values(PromotionResult)},
)
CASCADES = Metric(
    "kvscope_cascades_total", Kind.COUNTER,
    "Primary -> secondary tier writes (one per key), by result.",
    (L_RESULT,), label_values={L_RESULT: _values(CascadeResult)},
)
STORE_JOBS = Metric(
    "kvscope_store_jobs_total", Kind.COUNTER,
    "prepare_store calls by result; no_space = the primary tier could not take one step's "
    "store job, so nothing from it reaches any tier.",
    (L_RESULT,), label_values={L_RESULT: _values(StoreJobResult)},
)
# ---- per-KV-group stores (one C-level pass per store job, on the aggregator thread) ------
STORE_KEYS = Metric(
    "kvscope_store_keys_total", Kind.COUNTER,
    "Keys of store jobs (prepare_store calls) per KV group, by what became of them: stored "
    "(written into the CPU primary tier; with a secondary tier, cascaded to it), held (not "
    "written: the primary tier held it already), no_space (its job was refused: it reaches no "
    "tier). A "
    "group's keys per token are its tokens per chunk's inverse: a sub-block or drafter group "
    "stores many times the keys of the others.",
    (L_KV_GROUP, L_RESULT), label_values={L_RESULT: _values(StoreKeyResult)},
)
STORE_BYTES = Metric(
    "kvscope_store_bytes_total", Kind.COUNTER,
    "Bytes stored into the CPU primary tier per KV group (its stored keys x "
    "kvscope_primary_row_bytes): each group's share of the tier's write traffic and of what "
    "cascades to the secondary tiers.",
    (L_KV_GROUP,),
)
STORE_TOKENS = Metric(
    "kvscope_store_tokens_total", Kind.COUNTER,
    "Prompt tokens whose KV of each group was stored into the CPU primary tier (its stored "
    "keys x the group's tokens per chunk). Groups that store in proportion to their block "
    "sizes store about the same tokens; a full-attention group far below the others reaches "
    "no tier for the prefixes the others fill it with (tier flooded by one group).",
    (L_KV_GROUP,),
)
EVICTED_KEYS = Metric(
    "kvscope_evicted_keys_total", Kind.COUNTER,
    "Keys the CPU primary tier evicted to make room for store jobs, per KV group of the key "
    "evicted (with a secondary tier it stays there; the CPU tier alone drops it). Evictions "
    "made for promotions are not counted here.",
    (L_KV_GROUP,),
)
PRIMARY_KEYS = Metric(
    "kvscope_primary_keys", Kind.GAUGE,
    "Keys the CPU primary tier holds per KV group (rows holding a key, written or being "
    "written), read from its cache policy with the gauges: which group's keys fill the tier.",
    (L_KV_GROUP,),
)
PENDING_TRANSFERS = Metric(
    "kvscope_pending_transfers", Kind.GAUGE,
    "Transfers not yet finished: connector load/store jobs not reported by every rank, tier "
    "promotions and cascades in flight.",
    (L_KIND,), label_values={L_KIND: _values(PendingKind)},
)
OLDEST_PENDING_TRANSFER = Metric(
    "kvscope_oldest_pending_transfer_seconds", Kind.GAUGE,
    "Age of the oldest unfinished transfer of each kind (0 when none): how long a stuck "
    "transfer has been stuck, readable from a single scrape.",
    (L_KIND,), label_values={L_KIND: _values(PendingKind)},
)
REQUESTS = Metric(
    "kvscope_requests", Kind.GAUGE,
    "Unfinished requests as the connector sees them, by state.",
    (L_STATE,), label_values={L_STATE: _values(RequestState)},
)
REQUESTS_IN_FLIGHT = Metric(
    "kvscope_requests_in_flight", Kind.GAUGE,
    "Requests the connector has seen and not yet finished.",
)
SCHEDULER_STEPS = Metric(
    "kvscope_scheduler_steps_total", Kind.COUNTER,
    "Scheduler steps the connector took part in (build_connector_meta calls).",
)
LAST_STEP_TIMESTAMP = Metric(
    "kvscope_last_step_timestamp_seconds", Kind.GAUGE,
    "Unix time of the latest scheduler step, stamped when kvscope applies it (within "
    "flush_interval_s, default 1 s); "
    "alerts use it to reject stale gauges.",
)
INFO = Metric(
    "kvscope_info", Kind.GAUGE,
    "Always 1; labels describe the kvscope/vLLM build and the offload configuration "
    "(world_size: the worker ranks whose slots make one row, each exporting rank=\"0\".. on "
    "the worker-side series).",
    (L_KVSCOPE_VERSION, L_VLLM_VERSION, L_SPEC, L_TIERS, L_PRIMARY_ROWS, L_HASH_SEED,
     L_CHECKSUM_POLICY, L_CHUNK_TOKENS, L_MAX_BATCHED_TOKENS, L_WORLD_SIZE),
)
QUARANTINED_KEYS = Metric(
    "kvscope_quarantined_keys", Kind.GAUGE,
    "Keys kvscope answers MISS for because a rank refused to load their rows (checksum "
    "mismatch); released when the row is evicted, so the next promotion is checked afresh.",
)
CHECKSUM_RANKS = Metric(
    "kvscope_checksum_ranks", Kind.GAUGE,
    "Worker ranks by how their slot of promoted rows is checked: digested (compared with "
    "the scheduler's digests before each load) or shared_region (the rank maps the "
    "scheduler's own region file, so it reads the promoted bytes themselves). Both 0 "
    "without a secondary tier or with checksum_policy off.",
    (L_CHECK,), label_values={L_CHECK: _values(RankCheck)},
)
PRIMARY_ROW_BYTES = Metric(
    "kvscope_primary_row_bytes", Kind.GAUGE,
    "Bytes of one primary-tier row (one chunk of one KV group, every rank's slot); "
    "rows x this = cpu_bytes_to_use actually used.",
)
LAST_ROUND_REQUEST_KEYS = Metric(
    "kvscope_last_round_request_keys", Kind.GAUGE,
    "Chunk keys (summed over KV groups) the request of the latest vetoed or deferred round "
    "covers (0 until the first one): the rows a full restore of it needs at once.",
    (L_VERDICT,), label_values={L_VERDICT: (Verdict.VETOED.value, Verdict.DEFERRED.value)},
)
# ---- restore coverage (per ended lookup round: hit, miss or vetoed) --------------------
RESTORE_HELD_TOKENS = Metric(
    "kvscope_restore_held_tokens_total", Kind.COUNTER,
    "Tokens of the looked-up requests' prefixes (beyond the GPU prefix cache) that the offload "
    "tiers held when a lookup round ended, with vLLM's cross-group AND applied: what full "
    "restores would have loaded. Coverage = kvscope_hit_tokens_total / this.",
)
RESTORE_SHORT_ROUNDS = Metric(
    "kvscope_restore_short_rounds_total", Kind.COUNTER,
    "Ended lookup rounds that offered less than the request's whole loadable prefix, by why "
    "the offer stopped there; not_stored is benign (the tiers hold no more), store_refused "
    "means the tiers hold no more because the prefix's store job was refused for lack of a "
    "primary row (stored in part), the others mean the tiers held more than was offered.",
    (L_REASON,), label_values={L_REASON: _values(ShortReason)},
)
RESTORE_SHORT_TOKENS = Metric(
    "kvscope_restore_short_tokens_total", Kind.COUNTER,
    "Tokens of ended rounds' prefixes that were not offered, by reason: held minus offered "
    "under the reason the offer stopped at, the prefix beyond what the tiers hold under "
    "not_stored (store_refused where its store job was refused). These tokens are recomputed.",
    (L_REASON,), label_values={L_REASON: _values(ShortReason)},
)
RESTORE_STOPPED_ROUNDS = Metric(
    "kvscope_restore_stopped_rounds_total", Kind.COUNTER,
    "Ended lookup rounds of kvscope_restore_short_rounds_total by the KV group whose scan "
    "stopped the offer: the group whose stored prefix ends there (not_stored, "
    "store_refused), whose promotion found no free primary row (row_ceiling), whose miss "
    "vetoed the others (group_veto; a sliding-window group's missing window); rounds no "
    "group's miss explains (a load cap without a miss) are not counted here.",
    (L_KV_GROUP, L_REASON), label_values={L_REASON: _values(ShortReason)},
)
RESTORE_COVERAGE = Metric(
    "kvscope_restore_coverage_ratio", Kind.HISTOGRAM,
    "Per ended lookup round whose request the tiers held at least one chunk of: tokens "
    "offered / tokens held (1 = a full restore).",
    buckets=COVERAGE_BUCKETS,
)
RESTORE_CEILING_ROUNDS = Metric(
    "kvscope_restore_ceiling_rounds_total", Kind.COUNTER,
    "Ended lookup rounds a promotion without a free primary row cut short while the tiers "
    "held more, by form: alone (the held prefix needs more rows than the tier has: the "
    "truncated form) or concurrent (it fits alone; other work pinned the rows).",
    (L_FORM,), label_values={L_FORM: _values(CeilingForm)},
)
LAST_CEILING_OFFERED_TOKENS = Metric(
    "kvscope_last_ceiling_round_offered_tokens", Kind.GAUGE,
    "Tokens offered by the latest ended round cut short by a promotion that found no free "
    "primary row (the truncated form pins this at rows x chunk tokens).",
)
LAST_CEILING_HELD_TOKENS = Metric(
    "kvscope_last_ceiling_round_held_tokens", Kind.GAUGE,
    "Tokens the tiers held for that round's request (what a full restore would have loaded).",
)
LAST_CEILING_ROWS_NEEDED = Metric(
    "kvscope_last_ceiling_round_rows_needed", Kind.GAUGE,
    "Primary rows (chunk keys over all KV groups) a full restore of that round's held prefix "
    "pins at once; above kvscope_primary_rows{state=\"total\"}, it can never fit.",
)
LAST_CEILING_CONCURRENT_REQUESTS = Metric(
    "kvscope_last_ceiling_round_concurrent_requests", Kind.GAUGE,
    "Requests restoring at that moment (deferred or loading, that round's request included).",
)
CEILING_CONCURRENT_REQUESTS = Metric(
    "kvscope_ceiling_round_concurrent_requests", Kind.HISTOGRAM,
    "Per round the row ceiling cut short: requests restoring at that moment (deferred or "
    "loading, its own included). Restores asking for rows at once; the latest-value gauge "
    "keeps only the last cut, which comes after the first restores loaded.",
    buckets=CONCURRENT_REQUEST_BUCKETS,
)
LAST_CEILING_CONCURRENT_ROWS = Metric(
    "kvscope_last_ceiling_round_concurrent_rows_needed", Kind.GAUGE,
    "Rows those concurrent restores need together (that round's held prefix plus the other "
    "requests' whole prefixes, an upper bound).",
)
KV_GROUP_INFO = Metric(
    "kvscope_kv_group_info", Kind.GAUGE,
    "Always 1; one series per KV-cache group with its attention kind, block size, for "
    "an EAGLE/MTP drafter's group how vLLM keys its trailing chunk (drafter), and the most "
    "chunks of the group one restore from a secondary tier promotes (restore_chunks: a "
    "sliding-window group whose lookup stops at its window; 0: every chunk of the prefix).",
    (L_KV_GROUP, L_KIND, L_TOKENS_PER_BLOCK, L_DRAFTER, L_RESTORE_CHUNKS),
    label_values={L_DRAFTER: _values(DrafterKeys)},
)
# ---- secondary-tier probe (its own thread, every few seconds; tiers/probe.py) ------------
TIER_LOST_KEYS = Metric(
    "kvscope_tier_lost_keys_total", Kind.COUNTER,
    "Keys a secondary tier had confirmed written (a completed cascade) whose data is gone: the "
    "probe found the block file of a recently written key missing (directory removed, volume "
    "unmounted or wiped, files cleaned out of band). Those prefixes are recomputed; nothing "
    "fails. Counted once per key, over a bounded sample of the latest keys written.",
    (L_TIER,),
)
TIER_ROOT_PRESENT = Metric(
    "kvscope_tier_root_present", Kind.GAUGE,
    "1 while the directory a secondary tier created at start-up (its config.json's folder "
    "under root_dir) exists, 0 once it is gone (removed or unmounted). vLLM's fs tier "
    "recreates its block folders on the next write, not this one.",
    (L_TIER,),
)
TIER_LAST_LOSS_TIMESTAMP = Metric(
    "kvscope_tier_last_loss_timestamp_seconds", Kind.GAUGE,
    "Unix time the probe last found keys of a secondary tier lost (0: never).",
    (L_TIER,),
)
# ---- settled at idle: vLLM's GPU block pool and the host's memory ----------------------
GPU_BLOCKS = Metric(
    "kvscope_gpu_blocks", Kind.GAUGE,
    "GPU KV-cache blocks of vLLM's block pool (its null block left out): total, and in use "
    "(held by a request or pinned; prefix-cached blocks no request holds count free), read "
    "with the other gauges.",
    (L_STATE,), label_values={L_STATE: _values(GpuBlockState)},
)
IDLE_GPU_BLOCKS = Metric(
    "kvscope_idle_gpu_blocks_in_use", Kind.GAUGE,
    "GPU KV-cache blocks vLLM's block pool still held at the end of the latest step that left "
    "the engine settled (no request known to the connector, no load or store job in flight; "
    "read after vLLM freed what the step finished). 0 on a healthy engine; above 0, blocks no "
    "request holds and nothing will free until a restart. Kept until the next such step.",
)
HOST_MEMORY_AVAILABLE = Metric(
    "kvscope_host_memory_available_bytes", Kind.GAUGE,
    "The scheduler host's available memory (MemAvailable in /proc/meminfo), sampled every "
    "few seconds off vLLM's scheduler thread (absent where /proc has none).",
)
PROCESS_RESIDENT_MEMORY = Metric(
    "kvscope_process_resident_memory_bytes", Kind.GAUGE,
    "Resident memory of the process kvscope's scheduler side runs in (vLLM's engine core: "
    "/proc/self/statm), sampled with kvscope_host_memory_available_bytes.",
)
VLLM_FAULTS_CONTAINED = Metric(
    "kvscope_vllm_faults_contained_total", Kind.COUNTER,
    "Calls on which the installed vLLM would have raised a known bug of its own, and kvscope "
    "answered as vLLM's quiet path instead so the engine went on, by fault: store_after_finish "
    "(vLLM 0.26: a store for a request whose state vLLM had already deleted, skipped; the "
    "finished request's last chunks are not offloaded, nothing else changes). Always 0 on a "
    "release without the bug or with kvscope's contain_vllm_faults off.",
    (L_FAULT,), label_values={L_FAULT: _values(VllmFault)},
)
TELEMETRY_ERRORS = Metric(
    "kvscope_telemetry_errors_total", Kind.COUNTER,
    "Exceptions the instrumentation caught and swallowed (serving went on).",
    (L_WHERE,), label_values={L_WHERE: _values(ErrorSite)},
)

# ---- worker side (per rank) ----------------------------------------------
TRANSFER_BYTES = Metric(
    "kvscope_transfer_bytes_total", Kind.COUNTER,
    "Bytes moved by KV transfers, per rank and direction (disk directions: rank=\"manager\").",
    (L_RANK, L_DIRECTION), label_values={L_DIRECTION: _values(Direction)},
)
TRANSFER_SECONDS = Metric(
    "kvscope_transfer_seconds", Kind.HISTOGRAM,
    "Duration of finished KV transfer jobs, per rank and direction.",
    (L_RANK, L_DIRECTION), buckets=TRANSFER_SECONDS_BUCKETS,
    label_values={L_DIRECTION: _values(Direction)},
)
TRANSFERS_IN_FLIGHT = Metric(
    "kvscope_transfers_in_flight", Kind.GAUGE,
    "Transfer jobs submitted and not yet finished, per rank and direction.",
    (L_RANK, L_DIRECTION), label_values={L_DIRECTION: _values(Direction)},
)
ROW_CHECKSUMS = Metric(
    "kvscope_row_checksums_total", Kind.COUNTER,
    "Promoted-row checksums compared by a rank before a CPU->GPU load, by outcome.",
    (L_RANK, L_OUTCOME), label_values={L_OUTCOME: _values(ChecksumOutcome)},
)
LOADS_REFUSED = Metric(
    "kvscope_loads_refused_total", Kind.COUNTER,
    "CPU->GPU loads a rank refused (vLLM recomputes those tokens instead).",
    (L_RANK, L_REASON), label_values={L_REASON: _values(RefusalReason)},
)
TRANSFERS_FAILED = Metric(
    "kvscope_transfers_failed_total", Kind.COUNTER,
    "KV transfer jobs vLLM's own worker reported failed, per rank and direction (vLLM 0.34: a "
    "failed load's request comes back through failed_recving and recomputes; kvscope's own "
    "refusals are kvscope_loads_refused_total).",
    (L_RANK, L_DIRECTION), label_values={L_DIRECTION: _values(Direction)},
)
# ---- restore time (restore_clock.py: per restore, from the request's first lookup round) ----
RESTORE_PHASE_SECONDS = Metric(
    "kvscope_restore_phase_seconds_total", Kind.COUNTER,
    "Seconds restores spent, per phase, from the request's first lookup round to the step "
    "that ran it with the offered tokens loaded: the scheduler's deferred rescans, waiting "
    "for a free primary row, the secondary tier's reads, the load to the GPU. Counted when "
    "the restore ends.",
    (L_PHASE,), label_values={L_PHASE: _values(RestorePhase)},
)
RESTORE_DURATION = Metric(
    "kvscope_restore_duration_seconds", Kind.HISTOGRAM,
    "Per restore (a request whose lookup offered tokens and whose load completed): seconds "
    "from its first lookup round to the step that ran it, by the restored prefix's length.",
    (L_PREFIX,), label_values={L_PREFIX: _values(PrefixLength)},
    buckets=RESTORE_SECONDS_BUCKETS,
)
RESTORE_RESCANS = Metric(
    "kvscope_restore_rescans_total", Kind.COUNTER,
    "Deferred lookup rounds of the restores counted in kvscope_restore_duration_seconds "
    "(vLLM asks a deferred request again each step).",
)
RESTORE_RESCAN_KEYS = Metric(
    "kvscope_restore_rescan_keys_total", Kind.COUNTER,
    "Keys those deferred rounds looked up (each rescans the prompt's keys from where it "
    "stopped).",
)
WORKER_LAST_STEP_TIMESTAMP = Metric(
    "kvscope_worker_last_step_timestamp_seconds", Kind.GAUGE,
    "Unix time a rank last reported (get_finished); a stuck rank stops advancing it.",
    (L_RANK,),
)

SCHEDULER_METRICS: tuple[Metric, ...] = (
    LOOKUPS, LOOKUP_ROUNDS, ROUND_PENDING_KEYS, LAST_ROUND_PENDING_KEYS, ROUNDS_AT_ROW_CEILING,
    HIT_TOKENS, PRIMARY_ROWS, PROMOTIONS, CASCADES, STORE_JOBS, STORE_KEYS, STORE_BYTES,
    STORE_TOKENS, EVICTED_KEYS, PRIMARY_KEYS, PENDING_TRANSFERS,
    OLDEST_PENDING_TRANSFER, REQUESTS,
    REQUESTS_IN_FLIGHT, SCHEDULER_STEPS, LAST_STEP_TIMESTAMP, INFO, KV_GROUP_INFO,
    TELEMETRY_ERRORS, PRIMARY_ROW_BYTES, LAST_ROUND_REQUEST_KEYS, QUARANTINED_KEYS,
    CHECKSUM_RANKS,
    RESTORE_HELD_TOKENS, RESTORE_SHORT_ROUNDS, RESTORE_SHORT_TOKENS, RESTORE_STOPPED_ROUNDS,
    RESTORE_COVERAGE, RESTORE_CEILING_ROUNDS, LAST_CEILING_OFFERED_TOKENS, LAST_CEILING_HELD_TOKENS, LAST_CEILING_ROWS_NEEDED,
    LAST_CEILING_CONCURRENT_REQUESTS, CEILING_CONCURRENT_REQUESTS, LAST_CEILING_CONCURRENT_ROWS,
    TIER_LOST_KEYS, TIER_ROOT_PRESENT, TIER_LAST_LOSS_TIMESTAMP,
    GPU_BLOCKS, IDLE_GPU_BLOCKS, HOST_MEMORY_AVAILABLE, PROCESS_RESIDENT_MEMORY,
    VLLM_FAULTS_CONTAINED,
    RESTORE_PHASE_SECONDS, RESTORE_DURATION, RESTORE_RESCANS, RESTORE_RESCAN_KEYS,
)
WORKER_METRICS: tuple[Metric, ...] = (
    TRANSFER_BYTES, TRANSFER_SECONDS, TRANSFERS_IN_FLIGHT, ROW_CHECKSUMS, LOADS_REFUSED,
    WORKER_LAST_STEP_TIMESTAMP, TRANSFERS_FAILED,
)
ALL_METRICS: tuple[Metric, ...] = SCHEDULER_METRICS + WORKER_METRICS
BY_NAME: dict[str, Metric] = {m.name: m for m in ALL_METRICS}

# Exported with EVERY value of their closed labels (``label_values``) from a process's
# first step on, for each value of their open labels (kv_group, rank): counters declared
# at 0 (Recorder.declare), snapshot gauges set on every refresh. A value missing from
# an input that has the series is therefore a partial export (a relabel rule, a
# federation filter, a cut scrape), never a zero: kv-diagnose does not judge by it.
# Not here: series whose values appear with their first event (transfer histograms,
# transfers in flight) or depend on the process (transfer bytes: workers move gpu<->cpu,
# the manager cpu<->disk). Promotions and cascades exist only with a secondary tier.
# tests/connector/test_preset_values.py checks this list.
PRESET_VALUES: tuple[Metric, ...] = (
    LOOKUPS, LOOKUP_ROUNDS, ROUNDS_AT_ROW_CEILING, PRIMARY_ROWS, PROMOTIONS, CASCADES,
    STORE_JOBS, STORE_KEYS, PENDING_TRANSFERS, OLDEST_PENDING_TRANSFER, REQUESTS,
    TELEMETRY_ERRORS,
    RESTORE_SHORT_ROUNDS, RESTORE_SHORT_TOKENS, RESTORE_STOPPED_ROUNDS, RESTORE_CEILING_ROUNDS,
    ROW_CHECKSUMS, LOADS_REFUSED, LAST_ROUND_PENDING_KEYS, LAST_ROUND_REQUEST_KEYS,
    CHECKSUM_RANKS, VLLM_FAULTS_CONTAINED,
)
# Preset only by the kvscope that also labels kvscope_info with world_size (0 = no such
# round yet): an input whose kvscope_info lacks that label predates the preset, and a value
# missing there may never have been exported (recordings made before it keep their verdicts).
PRESET_WITH_WORLD_SIZE: tuple[Metric, ...] = (LAST_ROUND_PENDING_KEYS, LAST_ROUND_REQUEST_KEYS)


def exposed_series(metric: Metric) -> tuple[str, ...]:
    """Every series name a scrape of ``metric`` yields (histograms fan out)."""
    if metric.kind is Kind.HISTOGRAM:
        return (f"{metric.name}_bucket", f"{metric.name}_sum", f"{metric.name}_count")
    return (metric.name,)


# --------------------------------------------------------------------------
# vLLM's own metrics kvscope reads (dashboards, rules, kv-diagnose) by their
# real exposed names. kvscope never emits these.
# --------------------------------------------------------------------------
VLLM_REQUESTS_RUNNING = "vllm:num_requests_running"
VLLM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_REQUESTS_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
# waiting requests by async KV load stage (0.33+, engines with a KV consumer connector):
# label ``stage``: waiting_to_start | in_progress | completed_waiting
VLLM_KV_FETCH_BY_STAGE = "vllm:num_requests_kv_fetch_by_stage"
VLLM_KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
VLLM_REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_EXTERNAL_PREFIX_QUERIES = "vllm:external_prefix_cache_queries_total"
VLLM_EXTERNAL_PREFIX_HITS = "vllm:external_prefix_cache_hits_total"
VLLM_OFFLOAD_LOAD_BYTES = "vllm:kv_offload_load_bytes_total"
VLLM_OFFLOAD_STORE_BYTES = "vllm:kv_offload_store_bytes_total"
# The first vLLM release that exports the native tiering series below (0.26 has none of them).
VLLM_NATIVE_SINCE = "0.33.0"
# vLLM 0.33's native tiering metrics (label ``tier``: "0:primary", "1:fs", ...), read by
# kv-diagnose's reduced-evidence path on an engine without kvscope (diagnostics/native.py).
VLLM_TIER_LABEL = "tier"
VLLM_TIERING_CHUNK_QUERIES = "vllm:kv_offload_tiering_chunk_queries_total"
VLLM_TIERING_CHUNK_HITS = "vllm:kv_offload_tiering_chunk_hits_total"
VLLM_TIERING_WRITE_BYTES = "vllm:kv_offload_tiering_write_bytes_total"
VLLM_TIERING_READ_BYTES = "vllm:kv_offload_tiering_read_bytes_total"
VLLM_TIERING_PROMOTION_ALLOC_FAILURES = "vllm:kv_offload_tiering_promotion_allocation_failures_total"
VLLM_TIERING_PROMOTION_JOB_FAILURES = "vllm:kv_offload_tiering_promotion_job_failures_total"
VLLM_TIERING_CASCADE_JOB_FAILURES = "vllm:kv_offload_tiering_cascade_job_failures_total"
VLLM_TIERING_ACTIVE_PROMOTIONS = "vllm:kv_offload_tiering_active_promotion_jobs"
VLLM_TIERING_ACTIVE_CASCADES = "vllm:kv_offload_tiering_active_cascade_jobs"
VLLM_TIERING_PROMOTION_LATENCY_COUNT = "vllm:kv_offload_tiering_promotion_latency_seconds_count"
# share of the primary tier's chunks held by promotions (write) / cascades (read), per tier
VLLM_TIERING_PRIMARY_WRITE_USAGE = "vllm:kv_offload_tiering_primary_write_usage_perc"
VLLM_TIERING_PRIMARY_READ_USAGE = "vllm:kv_offload_tiering_primary_read_usage_perc"
VLLM_OFFLOAD_CONFIG_INFO = "vllm:kv_offload_config_info"
# 0.34: primary chunks of failed promotions held out of the free pool until the tier can no
# longer write into them (a read still in flight), per tier; and how long each was held
VLLM_TIERING_DEFERRED_RELEASE_CHUNKS = "vllm:kv_offload_tiering_deferred_release_chunks"
VLLM_TIERING_DEFERRED_RELEASE_HOLD = "vllm:kv_offload_tiering_deferred_release_hold_seconds"
VLLM_OFFLOAD_TOTAL_BYTES = "vllm:kv_offload_total_bytes_total"  # label transfer_type
VLLM_PROMPT_TOKENS_CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"  # label source
# store jobs prepare_store refused (no room in the primary tier); 0.26 exports it too
VLLM_OFFLOAD_ALLOCATION_FAILURES = "vllm:kv_offload_allocation_failure_total"
VLLM_NATIVE_OFFLOAD_SERIES: tuple[str, ...] = (
    VLLM_TIERING_CHUNK_QUERIES, VLLM_TIERING_CHUNK_HITS, VLLM_TIERING_WRITE_BYTES,
    VLLM_TIERING_READ_BYTES, VLLM_TIERING_PROMOTION_ALLOC_FAILURES,
    VLLM_TIERING_PROMOTION_JOB_FAILURES, VLLM_TIERING_CASCADE_JOB_FAILURES,
    VLLM_TIERING_ACTIVE_PROMOTIONS, VLLM_TIERING_ACTIVE_CASCADES,
    VLLM_TIERING_PROMOTION_LATENCY_COUNT, VLLM_OFFLOAD_CONFIG_INFO, VLLM_OFFLOAD_TOTAL_BYTES,
    VLLM_PROMPT_TOKENS_CACHED_BY_SOURCE, VLLM_OFFLOAD_ALLOCATION_FAILURES,
)


# --------------------------------------------------------------------------
# OpenTelemetry spans and attributes
# --------------------------------------------------------------------------
TRACER_NAME = "kvscope"
SPAN_LOOKUP_ROUND = "kvscope.lookup_round"
SPAN_PROMOTION = "kvscope.promotion"
SPAN_TRANSFER = "kvscope.transfer"

A_VERDICT = "kvscope.verdict"
A_REQUEST_ID_HASH = "kvscope.request.id_hash"  # salted, truncated: never the raw id
A_HIT_TOKENS = "kvscope.hit_tokens"
A_PENDING_KEYS = "kvscope.pending_keys"
A_PRIMARY_ROWS = "kvscope.primary_rows"
A_AT_ROW_CEILING = "kvscope.at_row_ceiling"
A_HELD_TOKENS = "kvscope.held_tokens"  # ended rounds: tokens the tiers held (cross-group AND)
A_SHORT_REASON = "kvscope.short_reason"  # ended rounds offering less than the whole prefix
# Per-group lookup result counts: one int array per result, indexed by kv_group.
A_GROUP_RESULT_PREFIX = "kvscope.lookups."  # + LookupResult value
A_TIER = "kvscope.tier"
A_ROW_COUNT = "kvscope.row_count"
A_RESULT = "kvscope.result"
A_RANK = "kvscope.rank"
A_DIRECTION = "kvscope.direction"
A_BYTES = "kvscope.bytes"
A_JOB_ID = "kvscope.job_id"
A_DURATION_S = "kvscope.duration_s"
A_SUCCESS = "kvscope.success"
