"""KV offload incident: the panels behind each alert, for the operator who just got paged."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from kvscope.exporters import signals as s

from . import common as c
from . import rules as r
from .config import DEFAULT, Config
from .rules import Recorded

R = c.RATE_INTERVAL
RANGE = "$__range"
TITLE = "KV offload / Incident"


def rows_needed_vs_rows(cfg: Config):
    total_rows = c.dsel(cfg, c.eq(s.L_STATE, s.RowState.TOTAL.value))
    return c.timeseries(
        "Rows needed vs primary-tier rows",
        "For the latest vetoed and deferred lookup round: the rows a full restore of its request "
        "needs at once (its chunk keys over all KV groups) and the keys it still waited for "
        "(retry plus hit_pending), against the primary tier's row count. A request needing more "
        "rows than exist can never be restored whole: its promotions evict each other and it is "
        f"deferred or vetoed forever ({r.ALERT_CAPACITY_CEILING}). Pending keys at the rows line "
        "mean the same from the other side. Fix by more primary rows or shorter prompts per "
        "request.",
        [
            (f"max by (instance, {s.L_VERDICT}) "
             f"({s.LAST_ROUND_REQUEST_KEYS.name}{c.dsel(cfg)})",
             f"rows needed ({{{{{s.L_VERDICT}}}}}) {{{{instance}}}}"),
            (f"max by (instance, {s.L_VERDICT}) "
             f"({s.LAST_ROUND_PENDING_KEYS.name}{c.dsel(cfg)})",
             f"pending keys ({{{{{s.L_VERDICT}}}}}) {{{{instance}}}}"),
            (f"max by (instance) ({s.PRIMARY_ROWS.name}{total_rows})",
             "primary rows {{instance}}"),
            (f"histogram_quantile(0.99, sum by (instance, le) "
             f"(rate({s.ROUND_PENDING_KEYS.name}_bucket{c.dsel(cfg)}[{R}])))",
             "p99 pending keys per round {{instance}}"),
        ],
    )


def rounds_at_ceiling(cfg: Config):
    return c.timeseries(
        "Rounds at the row ceiling",
        "Vetoed or deferred lookup rounds per second whose pending-key sum reached the primary "
        "tier's row count. Any sustained value above 0 is the capacity-ceiling incident; short "
        "spikes during a burst of long prompts are tolerable.",
        [(f"sum by (instance, {s.L_VERDICT}) "
          f"(rate({s.ROUNDS_AT_ROW_CEILING.name}{c.dsel(cfg)}[{R}]))",
          f"{{{{instance}}}} {{{{{s.L_VERDICT}}}}}")],
        unit="ops",
    )


def vetoed_deferred(cfg: Config):
    return c.timeseries(
        "Vetoed and deferred rounds vs promotions without a row",
        "Vetoed/deferred lookup rounds per second beside promotions refused for lack of a free "
        "primary row (no_row). Both rising together means the primary tier is pinned full; "
        "vetoed alone, without no_row, points at a KV group that never becomes ready.",
        [
            (f"sum by ({s.L_VERDICT}) ({Recorded(cfg).lookup_rounds_rate}"
             f"{c.rsel(c.re_in(s.L_VERDICT, s.Verdict.VETOED.value, s.Verdict.DEFERRED.value))})",
             f"{{{{{s.L_VERDICT}}}}} rounds"),
            (f"sum({Recorded(cfg).promotions_rate}"
             f"{c.rsel(c.eq(s.L_RESULT, s.PromotionResult.NO_ROW.value))})",
             "promotions without a row"),
        ],
        unit="ops",
    )


def rows_short(cfg: Config):
    by = cfg.by_engine
    return c.stat(
        "Rows short of a full restore",
        "Largest number of rows the request of the latest vetoed or deferred round needs beyond "
        "the primary tier's row count, over the selected engines (0: it fits). Red from 1: "
        "that request can never be restored from the offload tiers, however long it waits. The "
        "gauge keeps the latest such round, so check \"Rounds at the row ceiling\" for whether "
        "it still happens.",
        [(f"max(clamp_min(max by ({by}) ({s.LAST_ROUND_REQUEST_KEYS.name}{c.dsel(cfg)}) - on ({by}) "
          f"max by ({by}) "
          f"({s.PRIMARY_ROWS.name}{c.dsel(cfg, c.eq(s.L_STATE, s.RowState.TOTAL.value))}), 0))",
          "rows short")],
        width=6, height=8, red_at=1,
    )


def checksum_mismatches(cfg: Config):
    return c.stat(
        "Row checksum mismatches (time range)",
        "Promoted rows whose bytes differed from what was written, summed over all ranks in the "
        f"selected time range. Anything above 0 is {r.ALERT_CHECKSUM_MISMATCH}: the loads were "
        "refused (served by recompute), but a tier holds wrong data.",
        [(f"sum(increase({s.ROW_CHECKSUMS.name}"
          f"{c.dsel(cfg, c.eq(s.L_OUTCOME, s.ChecksumOutcome.MISMATCH.value), rank=True)}"
          f"[{RANGE}])) or vector(0)", "mismatches")],
        width=4, height=8, red_at=1,
    )


def quarantined_keys(cfg: Config):
    return c.stat(
        "Quarantined keys",
        "Keys kvscope answers MISS for because a rank refused to load their rows (checksum "
        "mismatch): the requests recompute instead of asking for the same bad rows again. They "
        "are released when the row is evicted. Mismatches with 0 here and no refused loads: the "
        "checksum policy only observes, and the mismatching rows were served.",
        [(f"sum({s.QUARANTINED_KEYS.name}{c.dsel(cfg)})", "keys")],
        width=4, height=8, red_at=1,
    )


def checksum_ranks(cfg: Config):
    return c.stat(
        "Ranks checked",
        "Worker ranks by how their slot of promoted rows is checked. digested: compared with "
        "the scheduler's digests before each load (a rank on another node). shared_region: "
        "the rank maps the scheduler's own region file and reads the promoted bytes "
        "themselves, so there is nothing to compare (checksum_scope unshared; 'all' digests "
        "them too). All 0: checksums off, or no secondary tier. 0 compared above with only "
        "shared_region ranks is expected, not a blind spot.",
        [(f"sum by ({s.L_CHECK}) ({s.CHECKSUM_RANKS.name}{c.dsel(cfg)})",
          f"{{{{{s.L_CHECK}}}}}")],
        width=4, height=8,
    )


def checksums_by_rank(cfg: Config):
    return c.timeseries(
        "Row checksums by rank",
        "Checksums compared per second by each rank before a CPU->GPU load, by outcome. A "
        "mismatch on one rank only: that rank's slot of the row is wrong (addressing, a stale "
        "row). On every rank: the row itself was overwritten or the disk tier returned stale "
        "data.",
        [(f"sum by ({s.L_RANK}, {s.L_OUTCOME}) "
          f"(rate({s.ROW_CHECKSUMS.name}{c.dsel(cfg, rank=True)}[{R}]))",
          f"rank {{{{{s.L_RANK}}}}} {{{{{s.L_OUTCOME}}}}}")],
        unit="ops",
    )


def loads_refused(cfg: Config):
    return c.timeseries(
        "Loads refused by rank",
        "CPU->GPU loads a rank refused (vLLM recomputed those tokens) by reason. "
        "checksum_error means the rank could not even read its own slot.",
        [(f"sum by ({s.L_RANK}, {s.L_REASON}) "
          f"(rate({s.LOADS_REFUSED.name}{c.dsel(cfg, rank=True)}[{R}]))",
          f"rank {{{{{s.L_RANK}}}}} {{{{{s.L_REASON}}}}}")],
        unit="ops",
    )


def tier_keys_lost(cfg: Config):
    return c.stat(
        "Disk tier keys lost (time range)",
        "Keys a secondary tier had confirmed written whose files kvscope's tier probe found "
        f"gone, in the selected time range ({r.ALERT_TIER_DATA_LOST}). Nothing fails when that "
        "happens: vLLM recreates the tier's folders on the next write and recomputes every "
        "prefix that was lost. Check the volume and who removed the files.",
        [(f"sum(increase({s.TIER_LOST_KEYS.name}{c.dsel(cfg)}[{RANGE}])) or vector(0)",
          "keys lost")],
        width=6, height=8, red_at=1,
    )


def tier_lost_and_present(cfg: Config):
    return c.timeseries(
        "Disk tier: keys lost and directory present",
        "Keys found lost per probe interval (bars of a loss), and whether the directory the "
        "tier created at start-up still exists (1) or is gone (0: removed or unmounted; vLLM "
        "recreates only the block folders). Losses with the directory present: files were "
        "deleted out of band, or vLLM removed files it could not read back.",
        [(f"sum by (instance, {s.L_TIER}) "
          f"(increase({s.TIER_LOST_KEYS.name}{c.dsel(cfg)}[{R}]))",
          f"lost {{{{{s.L_TIER}}}}} {{{{instance}}}}"),
         (f"min by (instance, {s.L_TIER}) ({s.TIER_ROOT_PRESENT.name}{c.dsel(cfg)})",
          f"directory present {{{{{s.L_TIER}}}}} {{{{instance}}}}")],
        width=18,
    )


def stored_tokens_by_group(cfg: Config):
    return c.timeseries(
        "Prompt tokens stored per KV group",
        "Prompt tokens per second whose KV each group stored into the CPU primary tier (its "
        "stored keys times its tokens per chunk; every key stored is cascaded to the disk tier). "
        "Groups that store in proportion to their block sizes draw about the same line, however "
        "many more keys a sub-block or drafter group stores. A full-attention group far below "
        "the others while one group fills the tier (next panel) is "
        f"{r.ALERT_TIER_FLOODED}: its chunks never complete or are refused, and no prefix "
        "restores without every group's chunks.",
        [(f"sum by ({s.L_KV_GROUP}) ({Recorded(cfg).store_tokens_rate}{c.rsel()})",
          f"KV group {{{{{s.L_KV_GROUP}}}}}")],
        unit="ops",
    )


def primary_keys_by_group(cfg: Config):
    return c.timeseries(
        "Primary tier keys per KV group",
        "Keys the CPU primary tier holds per KV group, beside its rows. A group whose "
        "blocks are N times smaller stores N times the keys per token and holds most of the "
        "tier on a healthy hybrid model; the tier is flooded when it holds nearly all of it "
        "while another full-attention group stores no tokens (previous panel).",
        [(f"sum by ({s.L_KV_GROUP}) ({s.PRIMARY_KEYS.name}{c.dsel(cfg)})",
          f"KV group {{{{{s.L_KV_GROUP}}}}}"),
         (f"sum({s.PRIMARY_ROWS.name}{c.dsel(cfg, c.eq(s.L_STATE, s.RowState.TOTAL.value))})",
          "primary rows")],
    )


def pending_vs_requests(cfg: Config):
    return c.timeseries(
        "Pending transfers vs requests",
        "Unfinished transfers by kind beside the requests that could be waiting for them. "
        "Pending transfers while requests run is normal. A pending line that stays flat above 0 "
        "while every request line is 0 is a transfer that will never finish "
        f"({r.ALERT_PENDING_AT_IDLE}): its rows stay pinned and its request's blocks may "
        "never be freed.",
        [
            (f"sum by ({s.L_KIND}) ({s.PENDING_TRANSFERS.name}{c.dsel(cfg)})",
             f"pending {{{{{s.L_KIND}}}}}"),
            (f"sum by ({s.L_STATE}) ({s.REQUESTS.name}{c.dsel(cfg)})",
             f"requests {{{{{s.L_STATE}}}}}"),
            (f"sum({s.VLLM_REQUESTS_RUNNING}{c.dsel(cfg, vllm=True)})", "vLLM running"),
            (f"sum({s.VLLM_REQUESTS_WAITING}{c.dsel(cfg, vllm=True)})", "vLLM waiting"),
        ],
    )


def oldest_pending(cfg: Config):
    return c.timeseries(
        "Oldest pending transfer age",
        "Age of the oldest unfinished transfer of each kind. A sawtooth that returns to 0 is "
        "healthy; a straight rising line is a stuck transfer, and its slope tells since when.",
        [(f"max by ({s.L_KIND}) ({s.OLDEST_PENDING_TRANSFER.name}{c.dsel(cfg)})",
          f"{{{{{s.L_KIND}}}}}")],
        unit="s",
    )


def in_flight_by_rank(cfg: Config):
    return c.timeseries(
        "Transfers in flight per rank",
        "Jobs submitted and not finished per rank and direction. One rank staying above 0 "
        "while the others return to 0 is a stuck rank: the scheduler waits for every rank to "
        "report a job before it counts as finished.",
        [(f"sum by ({s.L_RANK}, {s.L_DIRECTION}) "
          f"({s.TRANSFERS_IN_FLIGHT.name}{c.dsel(cfg, rank=True)})",
          f"rank {{{{{s.L_RANK}}}}} {{{{{s.L_DIRECTION}}}}}")],
    )


def gpu_blocks_at_idle(cfg: Config):
    return c.timeseries(
        "GPU KV blocks held at idle",
        "vLLM's GPU block pool: the blocks still in use at the end of the latest step that left "
        "nothing in flight (no request, no load or store job), beside the blocks in use now and "
        "the requests. A healthy engine's held-at-idle line is 0 whatever its load; above 0 "
        f"while the request lines are 0, blocks leaked ({r.ALERT_GPU_BLOCKS_HELD_AT_IDLE}): "
        "nothing frees them before a restart. A line that steps up after each burst leaks per "
        "request.",
        [
            (f"max by (instance) ({s.IDLE_GPU_BLOCKS.name}{c.dsel(cfg)})",
             "held at idle {{instance}}"),
            (f"max by (instance) "
             f"({s.GPU_BLOCKS.name}{c.dsel(cfg, c.eq(s.L_STATE, s.GpuBlockState.IN_USE.value))})",
             "in use {{instance}}"),
            (f"max by (instance) "
             f"({s.GPU_BLOCKS.name}{c.dsel(cfg, c.eq(s.L_STATE, s.GpuBlockState.TOTAL.value))})",
             "total {{instance}}"),
            (f"sum by (instance) ({s.REQUESTS_IN_FLIGHT.name}{c.dsel(cfg)})",
             "requests in flight {{instance}}"),
        ],
    )


def host_memory(cfg: Config):
    return c.timeseries(
        "Host memory vs engine process",
        "The scheduler host's available memory (MemAvailable) and the engine process's resident "
        "memory, sampled every few seconds by kvscope. Available memory falling while no "
        "request runs is a leak: in the engine when its resident line rises by as much, "
        "elsewhere on the host (another process, /dev/shm) when it stays flat (kv-diagnose's "
        "not_settled_at_idle). On vLLM's /metrics both stop moving while the engine does not "
        "step; kvscope's own endpoint keeps sampling.",
        [
            (f"min by (instance) ({s.HOST_MEMORY_AVAILABLE.name}{c.dsel(cfg)})",
             "host available {{instance}}"),
            (f"sum by (instance) ({s.PROCESS_RESIDENT_MEMORY.name}{c.dsel(cfg)})",
             "engine process {{instance}}"),
        ],
        unit="bytes", min0=False,
    )


def stats_freshness(cfg: Config):
    return c.timeseries(
        "Stats freshness",
        "Seconds since the scheduler's last step and since each rank last reported. Rising "
        "linearly while the engine is idle is normal (an idle engine does not step). Rising "
        "while requests are in flight means the engine or the stats path is hung and every "
        f"kvscope gauge is stale ({r.ALERT_STATS_STALE}). One rank rising alone: that rank hangs.",
        [
            (f"time() - max by (instance) ({s.LAST_STEP_TIMESTAMP.name}{c.dsel(cfg)})",
             "scheduler {{instance}}"),
            (f"time() - max by (instance, {s.L_RANK}) "
             f"({s.WORKER_LAST_STEP_TIMESTAMP.name}{c.dsel(cfg, rank=True)})",
             f"rank {{{{{s.L_RANK}}}}} {{{{instance}}}}"),
        ],
        unit="s",
    )


def scheduler_steps(cfg: Config):
    return c.timeseries(
        "Scheduler steps",
        "Scheduler steps per second the connector took part in. Drops to 0 at idle; a drop to "
        "0 while requests are in flight is a hung engine.",
        [(f"sum by (instance) (rate({s.SCHEDULER_STEPS.name}{c.dsel(cfg)}[{R}]))",
          "{{instance}}")],
        unit="ops",
    )


def vllm_faults_contained(cfg: Config):
    return c.stat(
        "vLLM faults contained (time range)",
        "Calls on which the installed vLLM would have raised a known bug of its own out of its "
        "scheduler step, killing the engine, and kvscope answered quietly instead, by fault "
        f"({r.ALERT_VLLM_FAULT_CONTAINED}): store_after_finish is vLLM 0.26's KeyError in "
        "TieringOffloadingManager.prepare_store, fixed in 0.27.0. The engine lived; upgrade "
        "vLLM (kv-diagnose names the release).",
        [(f"sum(increase({s.VLLM_FAULTS_CONTAINED.name}{c.dsel(cfg)}[{RANGE}])) or vector(0)",
          "contained")],
        width=6, height=8, red_at=1,
    )


def telemetry_errors(cfg: Config):
    return c.timeseries(
        "Instrumentation errors",
        "Exceptions kvscope caught and swallowed, by site (serving went on). Any error means "
        "the kvscope series above miss the events those calls recorded "
        f"({r.ALERT_TELEMETRY_ERRORS}; kv-diagnose reads inconclusive): report it with a "
        "kv-diagnose bundle.",
        [(f"sum by ({s.L_WHERE}) (rate({s.TELEMETRY_ERRORS.name}{c.dsel(cfg)}[{R}]))",
          f"{{{{{s.L_WHERE}}}}}")],
        unit="ops", width=18,
    )


def offload_config(cfg: Config):
    labels = [s.L_SPEC, s.L_TIERS, s.L_PRIMARY_ROWS, s.L_CHUNK_TOKENS, s.L_MAX_BATCHED_TOKENS,
              s.L_WORLD_SIZE, s.L_CHECKSUM_POLICY, s.L_HASH_SEED, s.L_KVSCOPE_VERSION,
              s.L_VLLM_VERSION]
    ident = ["instance", s.VLLM_LABEL_MODEL, s.VLLM_LABEL_ENGINE]
    return c.table(
        "Offload configuration",
        f"{s.INFO.name} of each engine. primary_rows against the longest prompt's chunks (times "
        "KV groups) decides the capacity ceiling; max_num_batched_tokens / chunk_tokens (times "
        "KV groups) is the largest store job one step makes, which must fit the primary rows; "
        "a hash_seed that changed across a restart orphans everything the tiers hold; "
        "world_size is the worker ranks each engine has (fewer ranks on the per-rank panels: a "
        "rank not scraped); checksum_policy observe serves mismatching rows instead of refusing "
        "them.",
        f"max by ({', '.join(ident + labels)}) ({s.INFO.name}{c.dsel(cfg)})",
        columns=ident + labels, width=18, height=5,
    )


def primary_tier_bytes(cfg: Config):
    by = cfg.by_engine
    return c.stat(
        "Primary tier size",
        "Rows times bytes per row (one chunk of one KV group, every rank's slot): the CPU "
        "memory the primary tier really uses, summed over the selected engines.",
        [(f"sum(max by ({by}) ({s.PRIMARY_ROW_BYTES.name}{c.dsel(cfg)}) * on ({by}) "
          f"max by ({by}) "
          f"({s.PRIMARY_ROWS.name}{c.dsel(cfg, c.eq(s.L_STATE, s.RowState.TOTAL.value))}))",
          "bytes")],
        unit="bytes", width=6, height=5,
    )


def build(cfg: Config = DEFAULT) -> db.Dashboard:
    return (
        c.dashboard(
            cfg, cfg.incident_uid, TITLE,
            "vLLM KV-cache offloading (kvscope): the evidence behind each KVOffload* alert.",
        )
        .link(c.link_to("Overview", cfg.overview_uid))
        .with_row(db.Row("Configuration"))
        .with_panel(offload_config(cfg))
        .with_panel(primary_tier_bytes(cfg))
        .with_row(db.Row("Capacity ceiling"))
        .with_panel(rows_short(cfg))
        .with_panel(rows_needed_vs_rows(cfg).span(18))
        .with_panel(rounds_at_ceiling(cfg))
        .with_panel(vetoed_deferred(cfg))
        .with_row(db.Row("Row integrity"))
        .with_panel(checksum_mismatches(cfg))
        .with_panel(quarantined_keys(cfg))
        .with_panel(checksum_ranks(cfg))
        .with_panel(checksums_by_rank(cfg).span(6))
        .with_panel(loads_refused(cfg).span(6))
        .with_row(db.Row("Disk tier"))
        .with_panel(tier_keys_lost(cfg))
        .with_panel(tier_lost_and_present(cfg))
        .with_row(db.Row("KV groups"))
        .with_panel(stored_tokens_by_group(cfg))
        .with_panel(primary_keys_by_group(cfg))
        .with_row(db.Row("Stuck transfers"))
        .with_panel(pending_vs_requests(cfg))
        .with_panel(oldest_pending(cfg))
        .with_panel(in_flight_by_rank(cfg).span(24))
        .with_row(db.Row("Settled at idle"))
        .with_panel(gpu_blocks_at_idle(cfg))
        .with_panel(host_memory(cfg))
        .with_row(db.Row("Freshness"))
        .with_panel(stats_freshness(cfg))
        .with_panel(scheduler_steps(cfg))
        .with_panel(telemetry_errors(cfg))
        .with_panel(vllm_faults_contained(cfg))
    )
