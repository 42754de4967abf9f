"""kv-diagnose on a stock vLLM 0.33 or later (no kvscope installed): reduced evidence.

vLLM 0.33 exports native offload metrics (``vllm:kv_offload_tiering_*`` per tier,
``vllm:kv_offload_config_info``, ``vllm:prompt_tokens_cached_by_source``, the
external prefix-cache counters, waiting requests by reason and by KV-fetch stage); 0.34
adds the primary chunks a failed promotion holds until its read ends
(``vllm:kv_offload_tiering_deferred_release_chunks``). They show *that* the tiers hold data and
*whether* anything came back, not *why*: no per-round verdicts, no per-group
lookups, no pending-key sums, no per-rank checksums. So every finding here is a
suspicion, marked reduced evidence, with what kvscope's
``ObservedOffloadingConnector`` would add to confirm or refute it.

Counters are read as lifetime totals from a scrape (``source.lifetime``) or as
their increase over a Prometheus window / bundle.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from kvscope.exporters import signals as S

from .evidence.quantities import counter_growth
from .evidence.targets import scope_key
from .model import RawWindow, Series, SourceInfo

_LOOKUPS_BY_GROUP = f"{S.LOOKUPS.name}{{{S.L_KV_GROUP},{S.L_RESULT}}}"

EXIT_HEALTHY, EXIT_INCIDENT, EXIT_INCONCLUSIVE = 0, 1, 3
# Chunk lookups, in primary tiers' worth, after which "nothing found anywhere" is suspicious.
SILENT_LOOKUP_FACTOR = 2
REDUCED = "reduced evidence: vLLM's native metrics only (kvscope not installed)"
INSTALL = ("install kvscope's ObservedOffloadingConnector (kv_connector_module_path="
           "kvscope.connector) on this engine to confirm")


def applies(raw: RawWindow) -> bool:
    """No kvscope series, but vLLM 0.33's native tiering metrics are there."""
    names = {s.name for s in raw.series}
    return (not any(n.startswith(S.PREFIX) for n in names)
            and any(n.startswith("vllm:kv_offload_tiering_") for n in names))


@dataclass
class NativeFacts:
    """What the native metrics say, summed over engines/targets."""

    tier_queries: dict[str, float] = field(default_factory=dict)  # tier -> chunk queries
    tier_hits: dict[str, float] = field(default_factory=dict)  # tier -> chunk hits
    disk_write_bytes: float = 0.0  # written to secondary tiers (cascades)
    disk_read_bytes: float = 0.0  # read from secondary tiers (promotions)
    promotion_alloc_failures: float = 0.0  # promotions that found no primary row
    store_alloc_failures: float = 0.0  # store jobs refused: no room in the primary tier
    promotion_job_failures: float = 0.0
    cascade_job_failures: float = 0.0
    promotions_done: float = 0.0  # completed promotion jobs (latency histogram count)
    active_promotions: float = 0.0  # gauges, last value
    active_cascades: float = 0.0
    primary_chunks: int = 0  # vllm:kv_offload_config_info{cpu_num_chunks}
    restored_bytes: float = 0.0  # CPU -> GPU
    stored_bytes: float = 0.0  # GPU -> CPU
    external_queries: float = 0.0
    external_hits: float = 0.0
    cached_by_source: dict[str, float] = field(default_factory=dict)
    requests_running: float = 0.0
    requests_waiting: float = 0.0
    # last values: waiting requests by reason (capacity | deferred) and, where the engine
    # exports it, by async KV-fetch stage (empty: not exported)
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    kv_fetch_by_stage: dict[str, float] = field(default_factory=dict)
    deferred_release_chunks: float = 0.0  # 0.34, last value summed over tiers
    # (target, model, engine) of each vllm:kv_offload_config_info: one per engine. The sums
    # above over several engines hide one engine's suspicion behind another's restores.
    engines: set[tuple[str, str, str]] = field(default_factory=set)


def _amount(s: Series, src: SourceInfo) -> float:
    """A counter's total (a scrape) or its increase over the window, as the observed path
    counts it: resets from zero, and a series first sampled after the window began (vLLM
    creates a labelled counter at its first increment) counted from zero."""
    if not s.samples:
        return 0.0
    born_inside = src.lifetime or s.samples[0][0] > src.start + 1e-6
    return counter_growth(s.samples, born_inside)


def collect(raw: RawWindow) -> NativeFacts:
    f = NativeFacts()
    src = raw.source
    sums: dict[str, float] = defaultdict(float)
    for s in raw.series:
        if not s.samples:
            continue
        last = float(s.samples[-1][1])
        tier = s.label(S.VLLM_TIER_LABEL)
        if s.name == S.VLLM_TIERING_CHUNK_QUERIES:
            f.tier_queries[tier] = f.tier_queries.get(tier, 0.0) + _amount(s, src)
        elif s.name == S.VLLM_TIERING_CHUNK_HITS:
            f.tier_hits[tier] = f.tier_hits.get(tier, 0.0) + _amount(s, src)
        elif s.name == S.VLLM_OFFLOAD_CONFIG_INFO:
            f.engines.add((s.target, s.label(S.VLLM_LABEL_MODEL), s.label(S.VLLM_LABEL_ENGINE)))
            chunks = s.label("cpu_num_chunks")
            if chunks.isdigit():
                f.primary_chunks += int(chunks)
        elif s.name == S.VLLM_OFFLOAD_TOTAL_BYTES:
            key = "restored" if s.label("transfer_type") == "CPU_to_GPU" else "stored"
            sums[key] += _amount(s, src)
        elif s.name == S.VLLM_PROMPT_TOKENS_CACHED_BY_SOURCE:
            where = s.label("source")
            f.cached_by_source[where] = f.cached_by_source.get(where, 0.0) + _amount(s, src)
        elif s.name in (S.VLLM_TIERING_ACTIVE_PROMOTIONS, S.VLLM_TIERING_ACTIVE_CASCADES,
                        S.VLLM_REQUESTS_RUNNING, S.VLLM_REQUESTS_WAITING,
                        S.VLLM_TIERING_DEFERRED_RELEASE_CHUNKS):
            sums[s.name] += last
        elif s.name == S.VLLM_REQUESTS_WAITING_BY_REASON:
            reason = s.label("reason")
            f.waiting_by_reason[reason] = f.waiting_by_reason.get(reason, 0.0) + last
        elif s.name == S.VLLM_KV_FETCH_BY_STAGE:
            stage = s.label("stage")
            f.kv_fetch_by_stage[stage] = f.kv_fetch_by_stage.get(stage, 0.0) + last
        else:
            sums[s.name] += _amount(s, src)
    f.disk_write_bytes = sums[S.VLLM_TIERING_WRITE_BYTES]
    f.disk_read_bytes = sums[S.VLLM_TIERING_READ_BYTES]
    f.promotion_alloc_failures = sums[S.VLLM_TIERING_PROMOTION_ALLOC_FAILURES]
    f.store_alloc_failures = sums[S.VLLM_OFFLOAD_ALLOCATION_FAILURES]
    f.promotion_job_failures = sums[S.VLLM_TIERING_PROMOTION_JOB_FAILURES]
    f.cascade_job_failures = sums[S.VLLM_TIERING_CASCADE_JOB_FAILURES]
    f.promotions_done = sums[S.VLLM_TIERING_PROMOTION_LATENCY_COUNT]
    f.active_promotions = sums[S.VLLM_TIERING_ACTIVE_PROMOTIONS]
    f.active_cascades = sums[S.VLLM_TIERING_ACTIVE_CASCADES]
    f.restored_bytes = sums["restored"]
    f.stored_bytes = sums["stored"]
    f.external_queries = sums[S.VLLM_EXTERNAL_PREFIX_QUERIES]
    f.external_hits = sums[S.VLLM_EXTERNAL_PREFIX_HITS]
    f.requests_running = sums[S.VLLM_REQUESTS_RUNNING]
    f.requests_waiting = sums[S.VLLM_REQUESTS_WAITING]
    f.deferred_release_chunks = sums[S.VLLM_TIERING_DEFERRED_RELEASE_CHUNKS]
    return f


@dataclass
class NativeFinding:
    id: str
    title: str
    evidence: list[str]
    next_step: str
    would_add: str  # what the observed connector would show to confirm or refute
    kind: str = "incident"  # incident (suspected) | healthy | inconclusive


def _primary_queries(f: NativeFacts) -> float:
    return sum(v for t, v in f.tier_queries.items() if t.endswith(":primary"))


def _secondary_hits(f: NativeFacts) -> float:
    return sum(v for t, v in f.tier_hits.items() if not t.endswith(":primary"))


def classify(f: NativeFacts) -> list[NativeFinding]:
    """Suspected incident classes, most specific first; [healthy] or [inconclusive]."""
    out: list[NativeFinding] = []
    disk_hits = _secondary_hits(f)
    restored = f.restored_bytes > 0 or f.external_hits > 0
    base = [f"external prefix cache: {f.external_hits:g} hit tokens of {f.external_queries:g} "
            f"queried; CPU->GPU {f.restored_bytes:g} bytes, GPU->CPU {f.stored_bytes:g} bytes",
            "tier chunk queries / hits: " + ", ".join(
                f"{t} {f.tier_queries.get(t, 0):g}/{f.tier_hits.get(t, 0):g}"
                for t in sorted(set(f.tier_queries) | set(f.tier_hits)))]
    if f.primary_chunks:
        base.append(f"primary tier: {f.primary_chunks} chunks (vllm:kv_offload_config_info)")
    if disk_hits > 0 and f.promotion_alloc_failures > 0 and not restored:
        out.append(NativeFinding(
            "capacity_ceiling_suspected",
            "Suspected capacity ceiling: the disk tier holds the prompts, promotions find no "
            "free primary row, nothing is restored",
            [*base, f"{disk_hits:g} secondary-tier chunk hits, "
                    f"{f.promotion_alloc_failures:g} promotions refused for want of a primary "
                    f"row, {f.promotions_done:g} promotion jobs completed, 0 tokens restored"],
            "Give the CPU tier more rows than one request's chunks times its KV groups "
            "(cpu_bytes_to_use), or " + INSTALL + ".",
            f"{S.ROUNDS_AT_ROW_CEILING.name} and {S.LAST_ROUND_PENDING_KEYS.name} against "
            f"{S.PRIMARY_ROWS.name}{{{S.L_STATE}=\"{S.RowState.TOTAL.value}\"}}: the exact row "
            f"shortfall per request, per KV group ({_LOOKUPS_BY_GROUP})"))
    if f.active_promotions + f.active_cascades + f.deferred_release_chunks > 0 and \
            f.requests_running == 0 and f.requests_waiting == 0:
        held = (f"; {f.deferred_release_chunks:g} primary chunks of failed promotions held "
                "until their reads end (vllm:kv_offload_tiering_deferred_release_chunks)"
                if f.deferred_release_chunks else "")
        out.append(NativeFinding(
            "pending_at_idle_suspected",
            "Suspected transfers pending at idle: tier jobs in flight with no request running "
            "or waiting",
            [*base, f"{f.active_promotions:g} promotion and {f.active_cascades:g} cascade jobs "
                    f"active{held}; 0 requests running, 0 waiting"],
            "Check the secondary tier's storage (stalled reads or writes), or " + INSTALL + ".",
            f"{S.PENDING_TRANSFERS.name}{{{S.L_KIND}}} and {S.OLDEST_PENDING_TRANSFER.name} "
            f"(GPU<->CPU jobs too, per rank: {S.TRANSFERS_IN_FLIGHT.name}"
            f"{{{S.L_RANK},{S.L_DIRECTION}}})"))
    # Waiting requests none of which waits on an async KV load, and no promotion a deferred
    # lookup could wait on: what holds them is the scheduler's capacity (GPU KV blocks, the
    # token budget), however vLLM words the reason (capacity, or deferred for the budget).
    fetching = sum(f.kv_fetch_by_stage.values())
    if f.kv_fetch_by_stage and f.requests_waiting > 0 and fetching == 0 \
            and f.active_promotions == 0:
        reasons = ", ".join(f"{v:g} {r}" for r, v in sorted(f.waiting_by_reason.items()))
        out.append(NativeFinding(
            "queue_wait_suspected",
            "Suspected queue wait: requests wait for the scheduler, none for a KV load",
            [*base, f"{f.requests_waiting:g} requests waiting ({S.VLLM_REQUESTS_WAITING}"
                    + (f"; by reason: {reasons}" if reasons else "") + "), "
                    + ", ".join(f"{f.kv_fetch_by_stage.get(st, 0):g} {st}"
                                for st in S.VLLM_KV_FETCH_STAGES)
                    + f" ({S.VLLM_KV_FETCH_BY_STAGE}), 0 promotion jobs active"],
            "The offload load path is not what holds them: the GPU KV cache or the batch "
            "limits (max_num_seqs, max_num_batched_tokens) are full; add capacity or shed "
            "load, or " + INSTALL + ".",
            f"{S.REQUESTS.name}{{{S.L_STATE}=\"{S.RequestState.QUEUED.value}\"}} beside "
            f"{S.LOOKUP_ROUNDS.name}: queued requests that no lookup round reaches"))
    if f.promotion_job_failures + f.cascade_job_failures > 0:
        out.append(NativeFinding(
            "tier_job_failures",
            "Secondary-tier jobs failed",
            [*base, f"{f.promotion_job_failures:g} promotion and {f.cascade_job_failures:g} "
                    "cascade job failures"],
            "Check the secondary tier's storage and its logs, or " + INSTALL + ".",
            f"{S.PROMOTIONS.name}{{{S.L_RESULT}=\"{S.PromotionResult.FAILED.value}\"}} / "
            f"{S.CASCADES.name}{{{S.L_RESULT}=\"{S.CascadeResult.FAILED.value}\"}} with "
            f"per-job spans ({S.SPAN_PROMOTION})"))
    if f.store_alloc_failures > 0 and f.stored_bytes == 0:
        out.append(NativeFinding(
            "store_never_fits_suspected",
            "Suspected store that never fits: every store job was refused, nothing was stored",
            [*base, f"{f.store_alloc_failures:g} store jobs refused for want of room in the "
                    "primary tier (vllm:kv_offload_allocation_failure_total), 0 bytes stored"],
            "Give the CPU tier more rows than one scheduler step stores (max_num_batched_tokens "
            "worth of chunks times the KV groups; cpu_bytes_to_use), or " + INSTALL + ".",
            f"{S.STORE_JOBS.name}{{{S.L_RESULT}=\"{S.StoreJobResult.NO_SPACE.value}\"}} "
            f"against {S.PRIMARY_ROWS.name}: the store job's size beside the tier's rows"))
    lookups = _primary_queries(f)
    found = sum(f.tier_hits.values())
    # Nothing found anywhere is what any fresh engine shows until its traffic repeats a
    # prefix: only a volume of lookups makes it a suspicion. The engine must have looked
    # up SILENT_LOOKUP_FACTOR primary tiers' worth of chunks (cpu_num_chunks) and found
    # none: a workload that repeats any prefix (a system prompt) would have hit by then.
    if not out and f.stored_bytes > 0 and not restored and found == 0 \
            and f.promotion_alloc_failures == 0 and f.primary_chunks > 0 \
            and lookups >= SILENT_LOOKUP_FACTOR * f.primary_chunks:
        out.append(NativeFinding(
            "stores_without_restores_suspected",
            "Suspected stores without restores: KV is stored, no lookup finds it",
            [*base, f"{lookups:g} chunk lookups ({lookups / f.primary_chunks:.1f}x the primary "
                    "tier's chunks), 0 found in any tier, 0 tokens restored while stores land"],
            "If this workload repeats prefixes, keys stored are not the keys looked up: check "
            "PYTHONHASHSEED is set and equal across restarts and processes (prefix hashes), or "
            + INSTALL + ".",
            f"{S.INFO.name}{{{S.L_HASH_SEED}}} per process and {_LOOKUPS_BY_GROUP}: "
            "whether the keys differ or one KV group misses"))
    if out:
        return out
    if len(f.engines) > 1:
        names = sorted(scope_key(*e) for e in f.engines)  # the name kv-diagnose gives it
        return [NativeFinding(
            "inconclusive", f"{len(f.engines)} engines in one window: their sums cannot say",
            [*base, f"engines: {', '.join(names[:6])}" + (" ..." if len(names) > 6 else ""),
             "their native counters are summed: one engine's restores hide another that "
             "restores nothing (a capacity ceiling, stores without restores)"],
            "Run kv-diagnose once per engine (one --scrape URL, or a --selector matching one "
            "instance).",
            "per-engine verdicts from kvscope_info", kind="inconclusive")]
    if restored:
        return [NativeFinding(
            "healthy", "Nothing suspicious in vLLM's native offload metrics",
            [*base], "None.",
            "per-round verdicts and per-rank checksums (stale rows are invisible here)",
            kind="healthy")]
    return [NativeFinding(
        "inconclusive", "Not enough traffic in vLLM's native offload metrics to tell",
        [*base, f"{_primary_queries(f):g} chunk lookups, nothing restored: fewer than "
                f"{SILENT_LOOKUP_FACTOR}x the primary tier's {f.primary_chunks} chunks, as any "
                "fresh engine shows; stuck GPU<->CPU transfers are not in vLLM's metrics"], INSTALL[0].upper() + INSTALL[1:] + ".",
        "lookup rounds and their verdicts", kind="inconclusive")]


@dataclass
class NativeReport:
    location: str
    findings: list[NativeFinding]
    facts: NativeFacts

    @property
    def exit_code(self) -> int:
        kinds = {f.kind for f in self.findings}
        if "incident" in kinds:
            return EXIT_INCIDENT
        return EXIT_HEALTHY if kinds == {"healthy"} else EXIT_INCONCLUSIVE

    def to_json(self) -> str:
        return json.dumps({
            "reduced_evidence": True, "note": REDUCED, "source": self.location,
            "verdicts": [f.__dict__ for f in self.findings],
            # the numbers every verdict's evidence lines are rendered from
            "facts": {**asdict(self.facts), "engines": sorted(self.facts.engines)},
        }, indent=2, sort_keys=True)

    def to_text(self) -> str:
        lines = [f"kv-diagnose: {self.location}", f"[{REDUCED}]", ""]
        for i, f in enumerate(self.findings, 1):
            lines.append(f"{i}. {f.title}  ({f.id}, reduced evidence)")
            lines += [f"   - {e}" for e in f.evidence]
            lines.append(f"   next step: {f.next_step}")
            lines.append(f"   kvscope would add: {f.would_add}")
            lines.append("")
        return "\n".join(lines)


def diagnose_native(raw: RawWindow) -> NativeReport:
    facts = collect(raw)
    return NativeReport(raw.source.location, classify(facts), facts)
