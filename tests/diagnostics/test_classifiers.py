"""One classifier at a time, on synthetic evidence (positive and negative cases)."""

from __future__ import annotations

from kvscope.diagnostics.classifiers import (
    CLASSIFIERS,
    capacity_ceiling_livelock,
    capacity_ceiling_veto,
    not_settled_at_idle,
    pending_at_idle,
    queue_wait,
    stale_rows,
    stale_telemetry,
    store_never_fits,
    stores_without_restores,
)
from kvscope.diagnostics.classifiers.capacity_ceiling_livelock import OwnRowsFacts
from kvscope.diagnostics.classifiers.pending_at_idle import InFlight, Pending
from kvscope.diagnostics.classifiers.shared_facts import RowBytes
from kvscope.diagnostics.classifiers.stale_rows import MatchedRank
from kvscope.diagnostics.classifiers.store_never_fits import JobSize
from kvscope.diagnostics.classifiers.tier_flooded_by_group import GroupStored
from kvscope.diagnostics.thresholds import Thresholds
from kvscope.diagnostics.verdict import one_engine, telemetry_gaps
from kvscope.diagnostics.verdict.diagnose import diagnose
from kvscope.exporters import signals as S

from .support import T0, L, base, declared, evidence, info

TH = Thresholds()


def with_info(d, **labels):
    """d with its kvscope_info series replaced by one carrying ``labels``."""
    d = {k: v for k, v in d.items() if not (isinstance(k, tuple) and k[0] == S.INFO.name)}
    return d | {info(**labels): [1, 1]}


def rounds(**v):
    return {L(S.LOOKUP_ROUNDS.name, verdict=k): vals for k, vals in v.items()}


def lookups(group, **v):
    return {L(S.LOOKUPS.name, kv_group=group, result=k): vals for k, vals in v.items()}


# ---- capacity ceiling, veto --------------------------------------------------
def veto_case(rows=4):
    d = base(rows=rows)
    d |= rounds(vetoed=[3, 6], deferred=[3, 6], hit=[0, 0])
    d |= {
        L(S.ROUNDS_AT_ROW_CEILING.name, verdict="vetoed"): [3, 6],
        L(S.LAST_ROUND_PENDING_KEYS.name, verdict="vetoed"): [rows, rows],
        # the vetoed request: 6 chunks x 2 KV groups, all resident at once to restore
        L(S.LAST_ROUND_REQUEST_KEYS.name, verdict="vetoed"): [12, 12],
        L(S.CASCADES.name, result="completed"): [24, 24],
        S.HIT_TOKENS.name: [0, 0],
    }
    d |= lookups("0", retry=[36, 72]) | lookups("1", miss=[6, 12], retry=[6, 12])
    return d


def test_veto_fires_with_rows_needed():
    f = capacity_ceiling_veto.classify(evidence(veto_case()), TH)
    assert f is not None and f.confidence_label == "high"
    assert f.facts.rounds_at_ceiling == 6 and f.facts.vetoed_rounds == 6  # all at the ceiling
    assert f.facts.disk_keys == 24
    # the vetoed request covers 12 keys, +25% = 15
    sz = f.facts.sizing
    assert (sz.rows_wanted, sz.rows_now, sz.request_verdict, sz.request_keys, sz.kv_groups) \
        == (15, 4, "vetoed", 12, 2)
    assert sz.row_bytes is None


def test_veto_without_request_keys_gives_only_the_lower_bound():
    d = veto_case()
    del d[L(S.LAST_ROUND_REQUEST_KEYS.name, verdict="vetoed")]  # a relabel rule dropped it
    f = capacity_ceiling_veto.classify(evidence(d), TH)
    assert f is not None  # the verdict stands on the rounds at the ceiling
    # rows + 1 = 5, + 25% -> 7; no estimate from lookup counts pretends to know more
    assert (f.facts.sizing.rows_wanted, f.facts.sizing.rows_now) == (7, 4)
    assert f.facts.sizing.request_keys is None  # the series is missing


def test_veto_gives_bytes_when_row_bytes_known():
    f = capacity_ceiling_veto.classify(evidence(veto_case()), Thresholds(row_bytes=1 << 20))
    assert f.facts.sizing.rows_wanted == 15
    assert f.facts.sizing.row_bytes == RowBytes(1 << 20, "--row-bytes")  # 15 rows: 15728640


def test_veto_rows_from_request_keys_and_bytes_from_row_bytes_gauge():
    d = veto_case()
    # the vetoed request covers 10 keys (5 chunks x 2 groups); one row is 16 KiB
    d[L(S.LAST_ROUND_REQUEST_KEYS.name, verdict="vetoed")] = [10, 10]
    d[S.PRIMARY_ROW_BYTES.name] = [16384, 16384]
    f = capacity_ceiling_veto.classify(evidence(d), TH)
    assert (f.facts.request_keys, f.facts.kv_groups) == (10, 2)  # 5 per KV group x 2
    # 10 keys + 25% = 12.5 -> 13 rows; 13 x 16 KiB = 212992 bytes
    sz = f.facts.sizing
    assert (sz.rows_wanted, sz.rows_now, sz.request_keys, sz.kv_groups) == (13, 4, 10, 2)
    assert sz.row_bytes == RowBytes(16384, S.PRIMARY_ROW_BYTES.name)


def test_veto_request_that_alone_fits_still_needs_more_than_the_tier():
    d = veto_case()
    d[L(S.LAST_ROUND_REQUEST_KEYS.name, verdict="vetoed")] = [3, 3]  # fits 4 rows alone
    f = capacity_ceiling_veto.classify(evidence(d), TH)
    assert (f.facts.sizing.request_keys, f.facts.sizing.rows_now) == (3, 4)  # alone: 3 ≤ 4
    assert f.facts.sizing.rows_wanted == 7  # rows + 1 = 5, + 25% -> 7


def test_veto_row_bytes_derived_from_manager_disk_bytes():
    d = veto_case()
    d[L(S.TRANSFER_BYTES.name, rank="manager", direction="cpu_to_disk")] = [24 * 8192, 24 * 8192]
    f = capacity_ceiling_veto.classify(evidence(d), TH)
    assert f.facts.sizing.row_bytes == RowBytes(8192, "disk-tier bytes per key")


def test_veto_needs_the_ceiling():
    d = veto_case()
    d[L(S.ROUNDS_AT_ROW_CEILING.name, verdict="vetoed")] = [0, 0]
    d[L(S.LAST_ROUND_PENDING_KEYS.name, verdict="vetoed")] = [2, 2]
    assert capacity_ceiling_veto.classify(evidence(d), TH) is None


def test_veto_of_a_request_larger_than_the_tier_needs_no_ceiling_count():
    # a livelock that ended in a veto: the vetoing round's pending-key sum was
    # below the row count, but the request covers 12 keys and the tier has 8 rows
    d = veto_case(rows=8)
    d[L(S.ROUNDS_AT_ROW_CEILING.name, verdict="vetoed")] = [0, 0]
    d[L(S.LAST_ROUND_PENDING_KEYS.name, verdict="vetoed")] = [3, 3]
    d[L(S.LAST_ROUND_REQUEST_KEYS.name, verdict="vetoed")] = [12, 12]
    assert capacity_ceiling_veto.classify(evidence(d), TH) is None  # no promotion ran out of rows
    d[L(S.PROMOTIONS.name, result="no_row")] = [20, 29]
    f = capacity_ceiling_veto.classify(evidence(d), TH)
    assert f is not None and f.confidence_label == "high"
    assert (f.facts.sizing.rows_wanted, f.facts.sizing.rows_now) == (15, 8)
    assert f.facts.sizing.request_keys == 12


def test_veto_silent_on_quiet_engine():
    assert capacity_ceiling_veto.classify(evidence(base()), TH) is None


# ---- capacity ceiling, livelock ------------------------------------------------
def livelock_case(rows=8):
    d = base(rows=rows, steps=[0, 30])
    d |= rounds(deferred=[0, 30], hit=[0, 0])
    d |= {
        L(S.PROMOTIONS.name, result="started"): [0, 135],
        L(S.PROMOTIONS.name, result="completed"): [0, 128],
        L(S.ROUNDS_AT_ROW_CEILING.name, verdict="deferred"): [0, 15],
        L(S.LAST_ROUND_PENDING_KEYS.name, verdict="deferred"): [rows, rows],
        L(S.REQUESTS.name, state="deferred"): [1, 1],
        S.HIT_TOKENS.name: [0, 0],
    }
    return d


def test_livelock_fires():
    f = capacity_ceiling_livelock.classify(evidence(livelock_case()), TH)
    assert f is not None and f.confidence_label == "high"
    assert f.facts.per_step == 4.5  # rows per scheduler step


def test_livelock_not_for_a_healthy_promotion():
    d = livelock_case()
    d |= rounds(deferred=[0, 30], hit=[0, 10])  # deferred then hit: disk promotions working
    d[S.HIT_TOKENS.name] = [0, 960]
    assert capacity_ceiling_livelock.classify(evidence(d), TH) is None


def test_livelock_needs_churn():
    d = livelock_case()
    d[L(S.PROMOTIONS.name, result="started")] = [0, 8]  # the tier did not turn over
    assert capacity_ceiling_livelock.classify(evidence(d), TH) is None


def test_livelock_exact_keys_do_not_need_the_churn_rate():
    # the window also covers idle steps: 135 promotions over 600 steps is a low rate
    d = livelock_case()
    d[S.SCHEDULER_STEPS.name] = [0, 600]
    assert capacity_ceiling_livelock.classify(evidence(d), TH) is None
    d[L(S.LAST_ROUND_REQUEST_KEYS.name, verdict="deferred")] = [12, 12]
    f = capacity_ceiling_livelock.classify(evidence(d), TH)
    assert f is not None
    assert (f.facts.request_keys, f.facts.kv_groups, f.facts.primary_rows) == (12, 1, 8)


def test_livelock_still_happening_between_scrapes():
    d = livelock_case()
    d |= rounds(deferred=[100, 110], hit=[5, 5])  # restored once long ago, stuck now
    d[S.HIT_TOKENS.name] = [80, 80]
    d[S.SCHEDULER_STEPS.name] = [200, 210]
    d[L(S.PROMOTIONS.name, result="started")] = [500, 545]
    f = capacity_ceiling_livelock.classify(evidence(d), TH)
    assert f is not None
    assert f.facts.recent_only and f.facts.recent_deferred_rounds == 10


# the self-evicting form: a deferred request that fits the tier promotes its own keys over
# and over (vLLM 0.33, the plan check's workload at 1,396 rows: 2 a step, its 64 keys)
def self_evicting_case():
    d = base(rows=1396, steps=[0, 133])
    d |= rounds(deferred=[0, 133], hit=[0, 0])
    d |= {
        L(S.PROMOTIONS.name, result="started"): [0, 266],
        L(S.PROMOTIONS.name, result="completed"): [0, 266],
        L(S.LAST_ROUND_REQUEST_KEYS.name, verdict="deferred"): [64, 64],
        L(S.REQUESTS.name, state="deferred"): [1, 1],
        S.HIT_TOKENS.name: [0, 0],
    }
    return d


def test_livelock_self_evicting_fires_though_the_churn_is_slow():
    f = capacity_ceiling_livelock.classify(evidence(self_evicting_case()), TH)
    assert f is not None and f.confidence_label == "high"
    assert isinstance(f.facts, OwnRowsFacts) and f.facts.lifetime and not f.facts.recent_only
    assert (f.facts.promotions_completed, f.facts.deferred_requests, f.facts.keys_covered) \
        == (266, 1, 64)
    assert round(f.facts.promotions_per_key, 1) == 4.2
    assert (f.facts.request_keys, f.facts.primary_rows) == (64, 1396)  # fits the tier
    assert "livelocked on their own rows" in f.next_step


def test_livelock_self_evicting_not_while_each_key_is_promoted_once():
    d = self_evicting_case()
    d[L(S.PROMOTIONS.name, result="completed")] = [0, 120]  # a slow disk, a restore on its way
    assert capacity_ceiling_livelock.classify(evidence(d), TH) is None


def test_livelock_self_evicting_not_for_promotions_still_in_flight():
    d = self_evicting_case()
    d[L(S.PROMOTIONS.name, result="completed")] = [0, 0]  # started, never done: stalled
    assert capacity_ceiling_livelock.classify(evidence(d), TH) is None


def test_livelock_self_evicting_not_once_restores_happen():
    d = self_evicting_case()
    d |= rounds(deferred=[0, 133], hit=[0, 4])
    d[S.HIT_TOKENS.name] = [0, 4096]
    assert capacity_ceiling_livelock.classify(evidence(d), TH) is None


def test_livelock_self_evicting_not_without_a_deferred_request_now():
    d = self_evicting_case()
    d[L(S.REQUESTS.name, state="deferred")] = [1, 0]  # it ended (vetoed, recomputed)
    assert capacity_ceiling_livelock.classify(evidence(d), TH) is None


def test_livelock_self_evicting_counts_every_deferred_request():
    d = self_evicting_case()
    d[L(S.REQUESTS.name, state="deferred")] = [3, 3]  # 3 x 64 keys: 266 is not twice over
    assert capacity_ceiling_livelock.classify(evidence(d), TH) is None


# ---- queue wait ----------------------------------------------------------------
def queue_case():
    d = base()
    d |= rounds(hit=[20, 20], miss=[5, 5])
    d[S.HIT_TOKENS.name] = [640, 640]
    d[L(S.REQUESTS.name, state="queued")] = [6, 7]
    d[L(S.REQUESTS.name, state="running")] = [4, 4]
    d[L(S.VLLM_REQUESTS_WAITING_BY_REASON, reason="capacity")] = [6, 7]
    d[S.VLLM_REQUESTS_WAITING] = [6, 7]
    return d


def test_queue_wait_fires_and_is_not_a_restore_failure():
    ev = evidence(queue_case())
    f = queue_wait.classify(ev, TH)
    assert f is not None and f.confidence_label == "high"
    assert "Not a restore failure" in f.next_step
    assert f.facts.hit_rounds == 20  # the restore path healthy when it runs
    report = diagnose(ev)
    assert [v.id for v in report.verdicts] == ["queue_wait"]


def test_queue_wait_not_when_queue_empties():
    d = queue_case()
    d[L(S.REQUESTS.name, state="queued")] = [6, 0]
    d[L(S.VLLM_REQUESTS_WAITING_BY_REASON, reason="capacity")] = [6, 0]
    d[S.VLLM_REQUESTS_WAITING] = [6, 0]
    assert queue_wait.classify(evidence(d), TH) is None


def test_queue_wait_not_while_vllm_holds_no_request():
    # vLLM's own gauges say nothing waits or runs: kvscope's queued count lags the engine
    d = queue_case()
    d[L(S.VLLM_REQUESTS_WAITING_BY_REASON, reason="capacity")] = [0, 0]
    d[S.VLLM_REQUESTS_WAITING] = [0, 0]
    d[S.VLLM_REQUESTS_RUNNING] = [0, 0]
    assert queue_wait.classify(evidence(d), TH) is None
    d[S.VLLM_REQUESTS_RUNNING] = [0, 1]  # one ran at the last scrape: vLLM holds a request
    assert queue_wait.classify(evidence(d), TH) is not None


def test_queue_wait_yields_to_ceiling():
    d = queue_case() | {L(S.ROUNDS_AT_ROW_CEILING.name, verdict="vetoed"): [1, 2]}
    assert queue_wait.classify(evidence(d), TH) is None


def test_queue_wait_ignores_connector_deferrals():
    d = base()
    d[L(S.VLLM_REQUESTS_WAITING_BY_REASON, reason="deferred")] = [3, 3]
    assert queue_wait.classify(evidence(d), TH) is None


def test_queue_wait_reads_vllms_deferred_reason_as_its_skipped_queue():
    # vLLM keeps requests the connector once deferred in its skipped-waiting queue
    # (reason="deferred") until it reaches them again; kvscope knows they are queued.
    d = base()
    d |= rounds(deferred=[4, 4], miss=[1, 1])
    d[L(S.REQUESTS.name, state="queued")] = [3, 3]
    d[L(S.REQUESTS.name, state="running")] = [1, 1]
    d[L(S.VLLM_REQUESTS_WAITING_BY_REASON, reason="capacity")] = [0, 0]
    d[L(S.VLLM_REQUESTS_WAITING_BY_REASON, reason="deferred")] = [3, 3]
    d[S.VLLM_REQUESTS_WAITING] = [3, 3]
    d[S.VLLM_REQUESTS_RUNNING] = [1, 1]
    f = queue_wait.classify(evidence(d), TH)
    assert f is not None and f.confidence_label == "high"
    assert (f.facts.vllm_waiting, f.facts.vllm_running) == (3, 1)
    assert f.facts.vllm_waiting_by_reason == {"capacity": 0, "deferred": 3}
    assert f.facts.skipped_waiting == 3  # vLLM's reason=deferred is its skipped-waiting queue


def test_queue_wait_not_while_the_connector_holds_them():
    d = base()
    d[L(S.REQUESTS.name, state="deferred")] = [3, 3]
    d[L(S.VLLM_REQUESTS_WAITING_BY_REASON, reason="deferred")] = [3, 3]
    d[S.VLLM_REQUESTS_WAITING] = [3, 3]
    assert queue_wait.classify(evidence(d), TH) is None


# ---- stale rows ----------------------------------------------------------------
def stale_case(refused=True):
    d = base()
    d[L(S.PROMOTIONS.name, result="completed")] = [16, 16]
    d[L(S.ROW_CHECKSUMS.name, rank="0", outcome="match")] = [16, 16]
    d[L(S.ROW_CHECKSUMS.name, rank="1", outcome="match")] = [4, 4]
    d[L(S.ROW_CHECKSUMS.name, rank="1", outcome="mismatch")] = [12, 12]
    d[L(S.LOADS_REFUSED.name, rank="1", reason="checksum_mismatch")] = [12 if refused else 0] * 2
    return d


def test_stale_rows_names_the_rank():
    f = stale_rows.classify(evidence(stale_case()), TH)
    assert f is not None and f.confidence > 0.9
    (bad,) = f.facts.mismatched_ranks
    assert (bad.rank, bad.mismatched, bad.mismatched + bad.matched) == ("1", 12, 16)
    assert bad.loads_refused == 12 and not bad.served  # vLLM recomputed those tokens
    assert f.facts.clean_ranks == (MatchedRank("0", 16),)
    assert f.next_step.startswith("Every mismatching load was refused and recomputed")


def test_stale_rows_observe_policy_served():
    d = with_info(stale_case(refused=False), checksum_policy="observe")
    d[L(S.TRANSFER_BYTES.name, rank="1", direction="cpu_to_gpu")] = [0, 4096]
    f = stale_rows.classify(evidence(d), TH)
    (bad,) = f.facts.mismatched_ranks
    assert bad.served and bad.loads_refused == 0 and bad.loaded_bytes == 4096
    assert f.facts.checksum_policies == ("observe",) and f.facts.served_ranks == ("1",)
    assert f.next_step.startswith("Mismatching rows were SERVED")


def test_stale_rows_refuse_configured_but_nothing_refused_is_served():
    # one refusal is one load job over many rows: rows vs jobs must not be mixed
    d = with_info(stale_case(refused=False), checksum_policy="refuse")
    f = stale_rows.classify(evidence(d), TH)
    # refuse configured, yet rank 1 refused none: observe was in effect
    assert f.facts.checksum_policies == ("refuse",) and f.facts.served_ranks == ("1",)
    assert f.next_step.startswith("Mismatching rows were SERVED")


def test_stale_rows_one_refused_job_covers_many_rows():
    d = with_info(stale_case(), checksum_policy="refuse")
    d[L(S.LOADS_REFUSED.name, rank="1", reason="checksum_mismatch")] = [1, 1]  # 12 rows, 1 job
    d[S.QUARANTINED_KEYS.name] = [12, 12]
    f = stale_rows.classify(evidence(d), TH)
    assert f.facts.served_ranks == ()
    assert f.facts.mismatched_ranks[0].loads_refused == 1
    assert f.facts.quarantined_keys == 12
    assert f.facts.checksum_policies == ("refuse",)  # refused and recomputed


def test_stale_rows_silent_when_all_match():
    d = base()
    d[L(S.ROW_CHECKSUMS.name, rank="0", outcome="match")] = [16, 16]
    assert stale_rows.classify(evidence(d), TH) is None


# ---- pending at idle -------------------------------------------------------------
def pending_case(age=(95, 96)):
    d = base()
    d[L(S.PENDING_TRANSFERS.name, kind="store")] = [1, 1]
    d[L(S.OLDEST_PENDING_TRANSFER.name, kind="store")] = list(age)
    d[L(S.TRANSFERS_IN_FLIGHT.name, rank="0", direction="gpu_to_cpu")] = [0, 0]
    d[L(S.TRANSFERS_IN_FLIGHT.name, rank="1", direction="gpu_to_cpu")] = [1, 1]
    d[S.VLLM_REQUESTS_RUNNING] = [0, 0]
    d[S.VLLM_REQUESTS_WAITING] = [0, 0]
    return d


def test_pending_at_idle_names_rank_and_direction():
    f = pending_at_idle.classify(evidence(pending_case()), TH)
    assert f is not None
    assert f.facts.pending == (Pending("store", 1, 96),) and f.facts.threshold_s == 30
    assert f.facts.in_flight == (InFlight("1", "gpu_to_cpu", 1),)
    assert "rank 1 (gpu_to_cpu)" in f.next_step


def test_pending_below_threshold_is_not_stuck():
    assert pending_at_idle.classify(evidence(pending_case(age=(1, 2))), TH) is None


def test_pending_while_busy_is_not_idle():
    d = pending_case()
    d[L(S.REQUESTS.name, state="running")] = [2, 2]
    assert pending_at_idle.classify(evidence(d), TH) is None


# ---- not settled at idle ---------------------------------------------------------
GIB = 1 << 30


def settle_case(held=(16, 16)):
    """An idle engine whose block pool still holds ``held`` blocks at idle (a scrape)."""
    d = base()
    d[S.IDLE_GPU_BLOCKS.name] = list(held)
    d[L(S.GPU_BLOCKS.name, state="in_use")] = list(held)
    d[S.VLLM_REQUESTS_RUNNING] = [0, 0]
    d[S.VLLM_REQUESTS_WAITING] = [0, 0]
    return d


def memory_case(available, resident, in_flight=None):
    """A Prometheus window of 10 min (11 samples) whose engine idles with no block held."""
    k = len(available)
    d = {key: [v[0]] * k if len(v) == 2 and v[0] == v[1] else v for key, v in base(
        steps=(100, 100), last_step=[T0] * 2).items()}
    d[S.HOST_MEMORY_AVAILABLE.name] = list(available)
    d[S.PROCESS_RESIDENT_MEMORY.name] = list(resident)
    if in_flight is not None:
        d[S.REQUESTS_IN_FLIGHT.name] = list(in_flight)
    return d


def _memory_window(d):
    return evidence(d, t1=T0 + 600, lifetime=False)


def test_blocks_held_at_idle_are_named_with_the_pool():
    f = not_settled_at_idle.classify(evidence(settle_case()), TH)
    assert f is not None and f.title == "The engine did not settle at idle (GPU blocks held)"
    b = f.facts.blocks  # held at the end of the latest step that left nothing in flight
    assert (b.held, b.total, b.in_use_now) == (16, 39, 16) and f.facts.memory is None
    assert (f.facts.vllm_running, f.facts.vllm_waiting) == (0, 0)  # nothing runs or waits
    assert f.confidence_label == "high" and "restart the engine" in f.next_step
    # 0 -> 16 between two scrapes: not held throughout the recent span (yet)
    assert not_settled_at_idle.classify(evidence(settle_case(held=(0, 16))), TH) is None
    f = not_settled_at_idle.classify(evidence(settle_case(held=(8, 16))), TH)
    assert (f.facts.blocks.grew_by, f.facts.blocks.held_first, f.facts.blocks.held) == (8, 8, 16)


def test_a_settled_or_busy_engine_is_not_flagged():
    assert not_settled_at_idle.classify(evidence(settle_case(held=(0, 0))), TH) is None
    d = settle_case()
    d[L(S.REQUESTS.name, state="running")] = [2, 2]  # blocks in use while requests run
    assert not_settled_at_idle.classify(evidence(d), TH) is None
    d = settle_case()
    d[S.VLLM_REQUESTS_WAITING] = [1, 1]
    assert not_settled_at_idle.classify(evidence(d), TH) is None


def test_host_memory_falling_at_idle_into_the_engine_process():
    avail = [40 * GIB - i * GIB // 4 for i in range(11)]  # 2.5 GiB lost over 10 min
    rss = [3 * GIB + i * GIB // 4 for i in range(11)]  # ... into the engine process
    f = not_settled_at_idle.classify(_memory_window(memory_case(avail, rss)), TH)
    assert f is not None and f.title == "The engine did not settle at idle (host memory falling)"
    m = f.facts.memory
    assert (m.dropped_bytes, m.from_bytes, m.to_bytes, m.over_s) \
        == (2.5 * GIB, 40 * GIB, 37.5 * GIB, 600) and f.facts.blocks is None
    assert m.process_grew_bytes == 2.5 * GIB and m.own  # the engine process grew meanwhile
    assert f.confidence_label == "high"
    flat = not_settled_at_idle.classify(_memory_window(memory_case(avail, [3 * GIB] * 11)), TH)
    assert flat.facts.memory.process_grew_bytes == 0 and not flat.facts.memory.own  # elsewhere
    assert flat.confidence_label == "medium" and "not the engine process" in flat.next_step


def test_host_memory_that_recovers_falls_little_or_falls_under_load_is_not_flagged():
    rss = [3 * GIB] * 11
    # fell by 3 GiB, then came back half way: 1.5 GiB below the start, no longer falling
    dip = [40 * GIB] * 4 + [37 * GIB] * 3 + [int(38.5 * GIB)] * 4
    small = [40 * GIB - i * (GIB // 20) for i in range(11)]  # 0.5 GiB: under the threshold
    for avail in (dip, small):
        assert not_settled_at_idle.classify(_memory_window(memory_case(avail, rss)), TH) is None
    falling = [40 * GIB - i * GIB // 4 for i in range(11)]
    busy = [2] * 9 + [0] * 2  # requests ran until the last two samples: two idle samples
    d = memory_case(falling, rss, in_flight=busy)
    assert not_settled_at_idle.classify(_memory_window(d), TH) is None


def test_without_the_series_nothing_is_needed_nor_found():
    d = {k: v for k, v in settle_case().items()
         if (k if isinstance(k, str) else k[0]) not in
         {m.name for m in (S.GPU_BLOCKS, S.IDLE_GPU_BLOCKS, S.HOST_MEMORY_AVAILABLE,
                           S.PROCESS_RESIDENT_MEMORY)}}
    ev = evidence(d)
    assert not_settled_at_idle.needs(ev) == ()  # an older kvscope: not "could not check"
    assert not_settled_at_idle.classify(ev, TH) is None


# ---- stores without restores ---------------------------------------------------
def swr_case():
    d = base()
    d[L(S.STORE_JOBS.name, result="prepared")] = [40, 50]
    d[L(S.CASCADES.name, result="completed")] = [80, 100]
    d |= rounds(miss=[40, 50]) | lookups("0", miss=[40, 50]) | lookups("1", miss=[40, 50])
    return d


def test_stores_without_restores_hash_seed_changed():
    d = swr_case()
    d[info(seed="0")] = [1]  # the old process' info series, one sample
    d[info(seed="1234")] = [1, 1]
    f = stores_without_restores.classify(evidence(d), TH)
    assert f is not None and f.title.endswith("(hash seed differs)")
    assert f.confidence_label == "high"
    assert "PYTHONHASHSEED" in f.next_step


def test_stores_without_restores_hash_seed_differs_between_targets():
    d = swr_case()
    d[info(seed="1", __target__="http://127.0.0.1:1/metrics")] = [1, 1]
    d[info(seed="2", __target__="http://127.0.0.1:2/metrics")] = [1, 1]
    f = stores_without_restores.classify(evidence(d), TH)
    assert f.facts.case == "hash seed differs"
    seeds = [(t.target, t.seeds) for t in f.facts.target_seeds]
    assert ("http://127.0.0.1:1/metrics", ("1",)) in seeds
    assert ("http://127.0.0.1:2/metrics", ("2",)) in seeds


def test_stores_without_restores_group_always_misses():
    d = swr_case() | lookups("0", hit=[40, 50], miss=[0, 0]) | rounds(vetoed=[40, 50], miss=[0, 0])
    f = stores_without_restores.classify(evidence(d), TH)
    assert f.title.endswith("(one group always misses)")
    assert (f.facts.silent_groups, f.facts.silent_group_lookups) == (("1",), 50)  # found 0


def test_stores_without_restores_generic_is_low_confidence():
    f = stores_without_restores.classify(evidence(swr_case()), TH)
    assert f.confidence_label == "low"


def test_stores_without_restores_needs_more_than_a_cold_caches_first_misses():
    # distinct prompts: each first lookup misses (retries are unresolved async
    # lookups), while the tiers hold many more keys than were ever missed
    d = base()
    d[L(S.STORE_JOBS.name, result="prepared")] = [1, 1]
    d[L(S.CASCADES.name, result="completed")] = [4, 4]
    d |= rounds(deferred=[4, 4], miss=[1, 1]) | lookups("0", miss=[1, 1], retry=[20, 20])
    d |= lookups("1", retry=[20, 20])
    assert stores_without_restores.classify(evidence(d), TH) is None


def test_stores_without_restores_not_claimed_when_the_cpu_tier_turned_over():
    # The CPU tier alone (no disk: evicted keys are gone) stored 3x its rows: the
    # oracle matrix's small CPU tiers flooded by later prompts found nothing on a
    # re-ask because LRU evicted it, with keys hashed alike (engine truth: healthy).
    d = base(rows=8)
    d.pop(info(rows=8))
    d[L(S.INFO.name, kvscope_version="0.1.0", vllm_version="0.26.0", spec="CPUOffloadingSpec",
        tiers="cpu", primary_rows="8", hash_seed="a1b2c3")] = [1, 1]
    d[L(S.STORE_JOBS.name, result="prepared")] = [20, 24]
    d |= rounds(miss=[40, 50]) | lookups("0", miss=[40, 50])
    d[S.PRIMARY_ROW_BYTES.name] = [4096, 4096]
    d[L(S.TRANSFER_BYTES.name, rank="0", direction="gpu_to_cpu")] = [0, 24 * 4096]
    assert stores_without_restores.classify(evidence(d), TH) is None
    # stored fewer keys than the tier has rows: nothing was evicted, the hint stands
    d[L(S.TRANSFER_BYTES.name, rank="0", direction="gpu_to_cpu")] = [0, 6 * 4096]
    f = stores_without_restores.classify(evidence(d), TH)
    assert f is not None and f.title.endswith("(nothing found)")


def test_no_stores_no_verdict():
    d = base() | rounds(miss=[40, 50]) | lookups("0", miss=[40, 50])
    assert stores_without_restores.classify(evidence(d), TH) is None


# ---- store never fits ------------------------------------------------------------
def test_store_never_fits():
    d = base(rows=4)
    d[L(S.STORE_JOBS.name, result="no_space")] = [10, 12]
    d[L(S.STORE_JOBS.name, result="prepared")] = [0, 0]
    d[L(S.CASCADES.name, result="completed")] = [0, 0]
    f = store_never_fits.classify(evidence(d), TH)
    assert f is not None and f.confidence_label == "high"
    assert "max_num_batched_tokens" in f.next_step and "cpu_bytes_to_use" in f.next_step


def test_store_never_fits_sizes_the_fix_from_kvscope_info():
    d = with_info(base(rows=4), rows=4, chunk_tokens="16", max_num_batched_tokens="256")
    d |= {L(S.KV_GROUP_INFO.name, kv_group=g, kind="full_attention", tokens_per_block="16"): [1, 1]
          for g in ("0", "1")}
    d[L(S.STORE_JOBS.name, result="no_space")] = [10, 12]
    d[S.PRIMARY_ROW_BYTES.name] = [16384, 16384]
    f = store_never_fits.classify(evidence(d), TH)
    # 256 tokens / 16 per chunk = 16 chunks x 2 groups = 32 rows per store job
    assert f.facts.job == JobSize(max_num_batched_tokens=256, chunk_tokens=16, kv_groups=2,
                                  chunks=16, rows_per_job=32)
    assert f.facts.primary_rows == 4
    # 32 + 25% margin = 40 rows x 16 KiB = 655360 bytes; or ≤ 4 // 2 chunks x 16 = 32 tokens
    assert f.facts.rows_wanted == 40 and f.facts.row_bytes.bytes == 16384
    assert f.facts.fit_tokens == 32


def test_store_fits_sometimes_when_disk_has_data():
    d = base(rows=4)
    d[L(S.STORE_JOBS.name, result="no_space")] = [10, 12]
    d[L(S.CASCADES.name, result="completed")] = [5, 9]
    assert store_never_fits.classify(evidence(d), TH) is None


# ---- stale telemetry --------------------------------------------------------------
def test_stale_telemetry_voids_gauge_verdicts():
    d = pending_case()
    d[info(world_size="2")] = d.pop(info())  # ranks 0 and 1: the world size holds no note
    d[S.LAST_STEP_TIMESTAMP.name] = [T0 - 600, T0 - 600]
    d[S.SCHEDULER_STEPS.name] = [500, 500]
    ev = evidence(d)
    f = stale_telemetry.classify(ev, TH)
    assert f is not None and f.facts.stale[0].step_age_s == 601  # 10 min before the scrape
    report = diagnose(ev)
    assert [v.id for v in report.verdicts] == ["stale_telemetry"]
    assert report.notes == ["not judged from stale gauges: Transfers pending on an idle engine"]


def test_old_step_on_idle_engine_is_not_stale():
    d = base(last_step=[T0 - 3600, T0 - 3600], steps=[50, 50])
    assert stale_telemetry.classify(evidence(d), TH) is None
    report = diagnose(evidence(d))
    assert report.healthy and report.top.facts.idle


# ---- healthy and ranking ------------------------------------------------------------
def test_healthy_says_what_was_checked():
    d = base() | rounds(hit=[10, 12], miss=[2, 2]) | lookups("0", hit=[60, 72])
    d[S.HIT_TOKENS.name] = [160, 192]
    report = diagnose(evidence(d))
    assert report.healthy and report.exit_code == 0
    checked = report.top.facts.checked
    # + the window-wide checks: one engine, kvscope's own errors
    assert len(checked) == len(CLASSIFIERS) + 2, report.top.evidence
    assert telemetry_gaps.CHECK in checked
    assert one_engine.CHECK in checked


def test_several_verdicts_are_ranked():
    d = stale_case() | veto_case()
    report = diagnose(evidence(d))
    ids = [v.id for v in report.verdicts]
    assert ids[:2] == ["stale_row_corruption", "capacity_ceiling_veto"]
    assert report.exit_code == 1


def test_a_broken_classifier_does_not_hide_the_others(monkeypatch):
    def boom(ev, th):
        raise RuntimeError("bug")

    monkeypatch.setattr(queue_wait, "classify", boom)
    report = diagnose(evidence(stale_case()))
    assert report.top.id == "stale_row_corruption"
    failed = [v for v in report.verdicts if v.kind == "error"]
    assert [v.id for v in failed] == ["check_failed:queue_wait"]
    assert (failed[0].facts.error, failed[0].facts.message) == ("RuntimeError", "bug")
    assert report.exit_code == 1


def test_a_broken_classifier_is_never_a_pass(monkeypatch):
    def boom(ev, th):
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(queue_wait, "classify", boom)
    d = base() | rounds(hit=[10, 12], miss=[2, 2]) | lookups("0", hit=[60, 72])
    report = diagnose(evidence(d))
    assert report.status == "inconclusive" and report.exit_code == 3
    assert [v.id for v in report.verdicts] == ["inconclusive", "check_failed:queue_wait"]


def test_store_never_fits_although_a_few_jobs_fit():
    # The oracle matrix: 6 prompts whose jobs were refused every step (104 refusals)
    # while 3 smaller jobs fit and 11 keys cascaded: those prompts were never stored.
    d = base(rows=7)
    d[L(S.STORE_JOBS.name, result="no_space")] = [0, 104]
    d[L(S.STORE_JOBS.name, result="prepared")] = [0, 3]
    d[L(S.CASCADES.name, result="completed")] = [0, 11]
    f = store_never_fits.classify(evidence(d), TH)
    assert f is not None
    assert f.facts.reached and (f.facts.refused_jobs, f.facts.prepared_jobs) == (104, 3)  # 35:1
    d[L(S.STORE_JOBS.name, result="prepared")] = [0, 30]  # refusals now and then: fits
    assert store_never_fits.classify(evidence(d), TH) is None


def test_store_fits_sometimes_with_the_cpu_tier_alone():
    # No disk tier, so nothing ever cascades: a store job that fit is what says
    # stores reach the tier (the oracle matrix found refusals now and then,
    # rows pinned by other requests, reported as "never fits").
    d = base(rows=8)
    d.pop(info(rows=8))
    d[L(S.INFO.name, kvscope_version="0.1.0", vllm_version="0.26.0", spec="CPUOffloadingSpec",
        tiers="cpu", primary_rows="8", hash_seed="a1b2c3")] = [1, 1]
    d[L(S.STORE_JOBS.name, result="no_space")] = [1, 2]
    d[L(S.STORE_JOBS.name, result="prepared")] = [30, 40]
    assert store_never_fits.classify(evidence(d), TH) is None
    d[L(S.STORE_JOBS.name, result="prepared")] = [0, 0]
    f = store_never_fits.classify(evidence(d), TH)
    assert f is not None and not f.facts.reached and not f.facts.tiered  # none fit the CPU tier


def test_tier_writes_failing_when_cascades_fail():
    from kvscope.diagnostics.classifiers import tier_writes_failing

    d = base() | declared()
    d[L(S.CASCADES.name, result="started")] = [10, 40]
    d[L(S.CASCADES.name, result="failed")] = [0, 30]  # a full disk: every write since failed
    d[L(S.CASCADES.name, result="completed")] = [10, 10]
    f = tier_writes_failing.classify(evidence(d, lifetime=False), TH)
    assert f is not None and f.confidence_label == "high"
    assert f.facts.cascades_failed == 30
    assert "df -h" in f.next_step
    assert diagnose(evidence(d, lifetime=False)).top.id == "tier_writes_failing"


def test_tier_writes_failing_quiet_when_writes_succeed_or_cpu_only():
    from kvscope.diagnostics.classifiers import tier_writes_failing

    d = base() | declared()
    d[L(S.CASCADES.name, result="completed")] = [10, 40]
    assert tier_writes_failing.classify(evidence(d, lifetime=False), TH) is None
    cpu_only = {k: v for k, v in (base() | declared()).items()
                if not (isinstance(k, tuple) and k[0] == S.INFO.name)}
    cpu_only[L(S.INFO.name, kvscope_version="0.1.0", vllm_version="0.26.0",
               spec="CPUOffloadingSpec", tiers="cpu", primary_rows="8", hash_seed="a")] = [1, 1]
    cpu_only[L(S.CASCADES.name, result="failed")] = [0, 3]  # never exported without a tier
    assert tier_writes_failing.classify(evidence(cpu_only, lifetime=False), TH) is None


def _lost(present: float) -> dict:
    d = base() | declared()
    d[L(S.CASCADES.name, result="completed")] = [24, 24]
    d[L(S.TIER_LOST_KEYS.name, tier="fs")] = [0, 24]  # the directory removed between scrapes
    d[L(S.TIER_ROOT_PRESENT.name, tier="fs")] = [1, present]
    d[L(S.TIER_LAST_LOSS_TIMESTAMP.name, tier="fs")] = [0, T0 - 2]  # 3 s before the window ends (T0 + 1)
    return d


def test_tier_data_lost_names_the_keys_when_and_the_directory():
    from kvscope.diagnostics.classifiers import tier_data_lost

    f = tier_data_lost.classify(evidence(_lost(0), lifetime=False), TH)
    assert f is not None and f.confidence_label == "high"
    (lost,) = f.facts.tiers
    assert (lost.tier, lost.lost_keys) == ("fs", 24)
    assert lost.last_loss_at == T0 - 2 and f.facts.window_end - lost.last_loss_at == 3
    assert lost.root_present is False  # its start-up directory is gone
    assert "mount" in f.next_step and "restart the engine" in f.next_step
    assert diagnose(evidence(_lost(0), lifetime=False)).top.id == "tier_data_lost"
    kept = tier_data_lost.classify(evidence(_lost(1), lifetime=False), TH)
    assert kept.facts.tiers[0].root_present is True  # block files deleted out of band
    assert "restart the engine" not in kept.next_step


def test_tier_data_lost_quiet_when_nothing_is_lost_or_no_probe():
    from kvscope.diagnostics.classifiers import tier_data_lost

    d = _lost(1)
    d[L(S.TIER_LOST_KEYS.name, tier="fs")] = [0, 0]
    assert tier_data_lost.classify(evidence(d, lifetime=False), TH) is None
    old = {k: v for k, v in _lost(1).items()  # a kvscope without the tier probe
           if not (isinstance(k, tuple) and k[0].startswith("kvscope_tier_"))}
    assert tier_data_lost.classify(evidence(old, lifetime=False), TH) is None


def _stalled(deferred_requests: int, age: float) -> dict:
    d = base() | declared()
    d[L(S.PENDING_TRANSFERS.name, kind="promotion")] = [1, 1]
    d[L(S.OLDEST_PENDING_TRANSFER.name, kind="promotion")] = [age - 10, age]
    d[L(S.REQUESTS.name, state="deferred")] = [deferred_requests, deferred_requests]
    d[S.REQUESTS_IN_FLIGHT.name] = [deferred_requests, deferred_requests]
    d[L(S.LOOKUP_ROUNDS.name, verdict="deferred")] = [0, 500]
    d[L(S.PROMOTIONS.name, result="started")] = [6, 6]
    return d


def test_promotion_stalled_when_a_request_waits_on_an_old_promotion():
    from kvscope.diagnostics.classifiers import promotion_stalled

    f = promotion_stalled.classify(evidence(_stalled(1, 45.0), lifetime=False), TH)
    assert f is not None
    assert (f.facts.pending_promotions, f.facts.oldest_s) == (1, 45)
    assert f.facts.deferred_rounds == 500
    assert diagnose(evidence(_stalled(1, 45.0), lifetime=False)).top.id == "promotion_stalled"


def test_promotion_stalled_quiet_when_young_or_nobody_waits():
    from kvscope.diagnostics.classifiers import promotion_stalled

    assert promotion_stalled.classify(evidence(_stalled(1, 12.0), lifetime=False), TH) is None
    assert promotion_stalled.classify(evidence(_stalled(0, 45.0), lifetime=False), TH) is None


# ---- tier flooded by one KV group ----------------------------------------------
def flood_case(blocks=(128, 128, 16), keys=(0, 0, 28), held=(0, 0, 24), rows=24,
               refused=(0, 0, 0)):
    """KV groups of ``blocks`` tokens per block (one block a chunk) that stored ``keys`` keys
    in the window (from 0) and hold ``held`` keys of the primary tier now."""
    d = base(rows=rows) | declared()
    d.pop(info(rows=rows))
    d[info(rows=rows, chunk_tokens=str(blocks[0]), world_size="1")] = [1, 1]
    d[L(S.PRIMARY_ROWS.name, state="occupied")] = [rows, sum(held)]
    d[L(S.CASCADES.name, result="completed")] = [0, sum(keys)]
    d |= rounds(miss=[0, 5])
    for g, (bs, k, h, r) in enumerate(zip(blocks, keys, held, refused)):
        group = str(g)
        d[L(S.KV_GROUP_INFO.name, kv_group=group, kind="full_attention",
            tokens_per_block=str(bs))] = [1, 1]
        d[L(S.STORE_KEYS.name, kv_group=group, result="stored")] = [0, k]
        d[L(S.STORE_KEYS.name, kv_group=group, result="held")] = [0, 0]
        d[L(S.STORE_KEYS.name, kv_group=group, result="no_space")] = [0, r]
        d[L(S.STORE_TOKENS.name, kv_group=group)] = [0, k * bs]
        d[L(S.STORE_BYTES.name, kv_group=group)] = [0, k * 2048]
        d[L(S.EVICTED_KEYS.name, kv_group=group)] = [0, max(k - h, 0)]
        d[L(S.PRIMARY_KEYS.name, kv_group=group)] = [h, h]
        d |= lookups(group, miss=[0, 0])
    return d


def test_tier_flooded_by_group_names_the_flood_and_the_groups_that_stored_nothing():
    from kvscope.diagnostics.classifiers import tier_flooded_by_group as flood

    ev = evidence(flood_case())
    f = flood.classify(ev, TH)
    assert f is not None and f.confidence_label == "high"
    x = f.facts
    assert (x.flood_group, x.flood_keys, x.primary_keys, x.share, x.primary_rows) \
        == ("2", 24, 24, 1.0, 24)
    assert x.lifetime and x.groups[0] == GroupStored("0", "full_attention", 128, 0, 0, None)
    assert x.groups[2] == GroupStored("2", "full_attention", 16, 448, 28, 56 * 1024)
    assert x.victims == ("0", "1") and x.victim_tokens_least == 0  # they stored none
    assert x.victim_chunk_tokens == 128  # a chunk of KV groups 0, 1
    assert "blocks_per_chunk" in f.next_step
    assert diagnose(ev).top.id == flood.ID


def test_tier_flooded_by_group_refused_stores_say_so():
    from kvscope.diagnostics.classifiers import tier_flooded_by_group as flood

    f = flood.classify(evidence(flood_case(keys=(1, 1, 60), refused=(9, 9, 72))), TH)
    assert f is not None
    assert f.facts.victims == ("0", "1") and f.facts.victim_keys_refused == 18
    assert f.facts.victim_tokens_least > 0  # stored too few, their store jobs refused


def test_tier_flooded_by_group_quiet_on_a_healthy_hybrid_model():
    """Groups storing in proportion to their block sizes: the sub-block group holds most of the
    tier (here 56x the keys of each of two groups: 96.6 %) and stores the same tokens."""
    from kvscope.diagnostics.classifiers import tier_flooded_by_group as flood

    healthy = flood_case(blocks=(896, 896, 16), keys=(2, 2, 112), held=(1, 1, 56), rows=58)
    assert flood.classify(evidence(healthy), TH) is None
    assert diagnose(evidence(healthy)).top.id == "healthy"
    # an unaligned tail costs a large-block group at most a chunk: well above a quarter
    tails = flood_case(blocks=(128, 128, 16), keys=(3, 3, 30), held=(3, 3, 18), rows=24)
    assert flood.classify(evidence(tails), TH) is None
    # a victim below a quarter of the tokens is one, once the group holds most of the tier
    low = flood_case(blocks=(128, 128, 16), keys=(1, 3, 60), held=(1, 3, 20), rows=24)
    f = flood.classify(evidence(low), TH)
    assert f is not None and f.confidence_label == "medium"
    assert (f.facts.victims, f.facts.flood_group, f.facts.victim_fraction) == (("0",), "2", 0.25)
    assert 0 < f.facts.victim_tokens_least < 0.25 * f.facts.groups[2].stored_tokens
    # ... but not while no group holds most of the tier
    spread = flood_case(blocks=(128, 128, 16), keys=(0, 0, 28), held=(8, 8, 8), rows=24)
    assert flood.classify(evidence(spread), TH) is None


def test_tier_flooded_by_group_only_full_attention_groups_are_victims():
    from kvscope.diagnostics.classifiers import tier_flooded_by_group as flood

    d = flood_case(blocks=(16, 16), keys=(28, 0), held=(24, 0))
    d.pop(L(S.KV_GROUP_INFO.name, kv_group="1", kind="full_attention", tokens_per_block="16"))
    d[L(S.KV_GROUP_INFO.name, kv_group="1", kind="sliding_window", tokens_per_block="16")] = [1, 1]
    assert flood.classify(evidence(d), TH) is None  # a window's chunks are stored on purpose


def test_tier_flooded_by_group_not_judged_without_its_series_or_with_one_group():
    from kvscope.diagnostics.classifiers import tier_flooded_by_group as flood
    from kvscope.diagnostics.classifiers.needs import needs_of

    older = {k: v for k, v in flood_case().items()  # a kvscope predating per-group stores
             if not (isinstance(k, tuple) and k[0] in (
                 S.STORE_KEYS.name, S.STORE_TOKENS.name, S.STORE_BYTES.name,
                 S.EVICTED_KEYS.name, S.PRIMARY_KEYS.name))}
    assert needs_of(flood, evidence(older)) == ()
    assert flood.classify(evidence(older), TH) is None
    # with the others there, one dropped (a relabel rule): could not check
    dropped = {k: v for k, v in flood_case().items()
               if not (isinstance(k, tuple) and k[0] == S.PRIMARY_KEYS.name)}
    report = diagnose(evidence(dropped))
    assert report.top.id == "inconclusive"
    assert any(u.check == flood.ID and f"series {S.PRIMARY_KEYS.name} missing" in u.reasons
               for u in report.unchecked)
    one = flood_case(blocks=(16,), keys=(28,), held=(24,))
    assert needs_of(flood, evidence(one)) == ()
    # one group's stored tokens dropped while the others' are there: a partial export
    part = {k: v for k, v in flood_case().items()
            if k != L(S.STORE_TOKENS.name, kv_group="0")}
    report = diagnose(evidence(part))
    assert report.top.id == "inconclusive" and report.exit_code == 3
    assert any(u.check == flood.ID and any(f'{S.STORE_TOKENS.name} has no kv_group="0"' in r
                                          for r in u.reasons) for u in report.unchecked)
