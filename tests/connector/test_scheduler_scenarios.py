"""The scheduler-side connector inside vLLM's real scheduler on CPU.

Each test runs a scenario from ``kvscope.sim.scenarios`` (vLLM's Scheduler,
OffloadingConnector subclass, TieringOffloadingManager with its CPU primary tier
in /dev/shm and the fs tier on disk) and asserts on what a scrape of the kvscope
exporter returns, parsed with prometheus-client's parser, and on the spans an
in-memory OTel exporter received.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess

import pytest

from kvscope.exporters import signals as S
from kvscope.exporters.otel import request_id_hash
from kvscope.sim.scenarios import run_scenario
from tests.connector.support import Exposition

pytestmark = pytest.mark.vllm

ROUNDS = S.LOOKUP_ROUNDS.name
LOOKUPS = S.LOOKUPS.name


def test_healthy_store_evict_to_disk_promote_then_hit(spans):
    with run_scenario("healthy") as sc:
        ex = Exposition.scrape(sc.metrics_url)
        facts = sc.facts
        request_ids = list(sc.engine.finished)
    # the answer restored from disk is the answer computed the first time
    assert facts["same_output"], facts
    assert facts["restored_tokens"] == 96
    # lookups: the fs tier answers RETRY (async existence check / promotion), then HIT
    for group in ("0", "1"):
        assert ex.value(LOOKUPS, kv_group=group, result="retry") > 0
        assert ex.value(LOOKUPS, kv_group=group, result="hit") >= 6
    assert ex.value(ROUNDS, verdict="hit") == 1
    assert ex.value(ROUNDS, verdict="deferred") >= 1
    assert ex.value(ROUNDS, verdict="vetoed") == 0
    assert ex.value(S.HIT_TOKENS.name) == 96
    # 6 chunks x 2 groups promoted from disk, none refused for want of a row
    assert ex.value(S.PROMOTIONS.name, result="started") == 12
    assert ex.value(S.PROMOTIONS.name, result="completed") == 12
    assert ex.value(S.PROMOTIONS.name, result="no_row") == 0
    assert ex.value(S.ROUNDS_AT_ROW_CEILING.name) == 0
    row = ex.value(S.PRIMARY_ROW_BYTES.name)
    assert ex.value(S.TRANSFER_BYTES.name, rank=S.RANK_MANAGER, direction="disk_to_cpu") == 12 * row
    assert ex.value(S.CASCADES.name, result="completed") == ex.value(S.CASCADES.name,
                                                                     result="started") > 0
    # each rank loaded its slot of the 12 rows; both map the scheduler's own region file, so
    # they read the promoted bytes themselves and nothing is digested (shared_region.py)
    assert ex.value(S.CHECKSUM_RANKS.name, check="shared_region") == 2
    assert ex.value(S.CHECKSUM_RANKS.name, check="digested") == 0
    for rank in ("0", "1"):
        # a row holds [rank0 slot | rank1 slot]; a slot carries every layer's page, and a
        # row of one KV group fills that group's layers (half of them here)
        assert ex.value(S.TRANSFER_BYTES.name, rank=rank, direction="cpu_to_gpu") == \
            12 * (row / 2) / 2
        assert ex.value(S.ROW_CHECKSUMS.name, rank=rank) == 0
    assert ex.value(S.PENDING_TRANSFERS.name) == 0
    assert ex.value(S.PRIMARY_ROWS.name, state="total") == 12
    assert ex.value(S.TELEMETRY_ERRORS.name) == 0
    (info,) = ex.series(S.INFO.name)
    assert info[0]["tiers"] == "cpu+fs" and info[0]["primary_rows"] == "12"
    # the worker ranks the engine built, each on the worker-side series (kv-diagnose holds
    # the ranks it sees to this number)
    assert info[0][S.L_WORLD_SIZE] == str(len(sc.engine.ranks)) == "2"
    assert {lb[S.L_RANK] for lb, _ in ex.series(S.ROW_CHECKSUMS.name)} == {"0", "1"}
    assert info[0]["vllm_version"] == importlib.metadata.version("vllm")

    finished = spans.get_finished_spans()
    rounds = [s for s in finished if s.name == S.SPAN_LOOKUP_ROUND]
    verdicts = [s.attributes[S.A_VERDICT] for s in rounds]
    assert verdicts.count("hit") == 1
    hit = next(s for s in rounds if s.attributes[S.A_VERDICT] == "hit")
    assert hit.attributes[S.A_HIT_TOKENS] == 96
    assert list(hit.attributes[S.A_GROUP_RESULT_PREFIX + "hit"]) == [6, 6]
    promotions = [s for s in finished if s.name == S.SPAN_PROMOTION]
    assert promotions and all(s.attributes[S.A_TIER] == "fs" for s in promotions)
    assert sum(s.attributes[S.A_ROW_COUNT] for s in promotions) == 12
    transfers = [s for s in finished if s.name == S.SPAN_TRANSFER]
    assert {s.attributes[S.A_RANK] for s in transfers} == {0, 1}
    assert {s.attributes[S.A_DIRECTION] for s in transfers} == {"gpu_to_cpu", "cpu_to_gpu"}
    # no raw request ids in spans: only the salted digest
    for s in rounds:
        assert not any(str(v).startswith("req-") for v in s.attributes.values())
    # ... which names the request to a reader holding its id (this process's salt)
    hashes = {request_id_hash(r): r for r in request_ids}
    assert {s.attributes[S.A_REQUEST_ID_HASH] for s in rounds} <= set(hashes)
    assert hashes[hit.attributes[S.A_REQUEST_ID_HASH]] in request_ids
    # what a real run exports passes Prometheus' own naming lint
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed: the exposition lint did not run (the rest passed)")
    proc = subprocess.run(["promtool", "check", "metrics"], input=ex.text, text=True,
                          capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_capacity_ceiling_veto_form(spans):
    with run_scenario("capacity-ceiling") as sc:
        ex = Exposition.scrape(sc.metrics_url)
        facts = sc.facts
    rows = ex.value(S.PRIMARY_ROWS.name, state="total")
    assert rows == 6
    # the whole prompt sits on disk, yet nothing is restored: the AND vetoed it
    assert ex.value(S.CASCADES.name, result="completed") >= 12
    assert facts["restored_tokens"] == 0 and facts["same_output"]
    assert ex.value(ROUNDS, verdict="vetoed") >= 1
    assert ex.value(ROUNDS, verdict="hit") == 0
    assert ex.value(S.ROUNDS_AT_ROW_CEILING.name, verdict="vetoed") >= 1
    # the tell, exact: the vetoed round's pending-key sum equals the row count
    assert ex.value(S.LAST_ROUND_PENDING_KEYS.name, verdict="vetoed") == rows
    assert ex.value(S.LAST_ROUND_REQUEST_KEYS.name, verdict="vetoed") == 12
    assert ex.value(S.PROMOTIONS.name, result="no_row") > 0
    vetoed = [s for s in spans.get_finished_spans()
              if s.name == S.SPAN_LOOKUP_ROUND and s.attributes[S.A_VERDICT] == "vetoed"]
    assert vetoed and all(s.attributes[S.A_AT_ROW_CEILING] for s in vetoed)
    assert vetoed[-1].attributes[S.A_PENDING_KEYS] == 6
    assert vetoed[-1].attributes[S.A_PRIMARY_ROWS] == 6


def test_capacity_ceiling_livelock_form():
    with run_scenario("livelock") as sc:
        with sc.facts["step_lock"]:  # the background loop keeps stepping; read a stable state
            ex = Exposition.scrape(sc.metrics_url)
        facts = sc.facts
    rows = ex.value(S.PRIMARY_ROWS.name, state="total")
    assert rows == 8
    assert not facts["stuck_request_done"]
    deferred = ex.value(ROUNDS, verdict="deferred")
    steps = ex.value(S.SCHEDULER_STEPS.name)
    assert deferred >= 40
    assert ex.value(ROUNDS, verdict="hit") == 0 and ex.value(ROUNDS, verdict="vetoed") == 0
    # promotions churn about one row budget per step while nothing is restored
    churn = ex.value(S.PROMOTIONS.name, result="started")
    assert churn >= 0.5 * rows * 40
    assert ex.value(S.LAST_ROUND_PENDING_KEYS.name, verdict="deferred") == rows
    assert ex.value(S.ROUNDS_AT_ROW_CEILING.name, verdict="deferred") >= 10
    assert ex.value(S.REQUESTS.name, state="deferred") == 1
    assert ex.value(S.HIT_TOKENS.name) == 0
    assert steps >= 40


def test_store_never_fits():
    with run_scenario("store-never-fits") as sc:
        ex = Exposition.scrape(sc.metrics_url)
    assert ex.value(S.STORE_JOBS.name, result="no_space") > 0
    assert ex.value(S.STORE_JOBS.name, result="prepared") == 0
    assert ex.value(S.CASCADES.name, result="completed") == 0
    assert sc.facts["restored_tokens"] == 0


def test_queue_wait_is_not_a_restore_failure():
    with run_scenario("queue-wait") as sc:
        with sc.facts["step_lock"]:
            ex1 = Exposition.scrape(sc.metrics_url)
        # the queued requests are not looked up again while they wait for a slot
        with sc.facts["step_lock"]:
            for _ in range(10):
                sc.engine.step()
            sc.engine.refresh()
            ex2 = Exposition.scrape(sc.metrics_url)
    assert ex2.value(S.REQUESTS.name, state="queued") == 3
    assert ex2.value(S.REQUESTS.name, state="running") == 1
    assert ex2.value(ROUNDS) == ex1.value(ROUNDS)
    assert ex2.value(S.PENDING_TRANSFERS.name, kind="load") == 0
    assert ex2.value(S.SCHEDULER_STEPS.name) > ex1.value(S.SCHEDULER_STEPS.name)


def test_stores_without_restores_hash_seed_changes():
    with run_scenario("stores-without-restores") as sc:
        ex = Exposition.scrape(sc.metrics_url)
    seeds = {lab["hash_seed"] for lab, _ in ex.series(S.INFO.name)}
    assert len(seeds) == 2
    assert sc.facts["restored_tokens"] == 0
    assert ex.value(S.STORE_JOBS.name, result="prepared") > 0
    assert ex.value(S.HIT_TOKENS.name) == 0


def test_vllm_metrics_path_carries_kvscope_series():
    """Export path 1: through vLLM's stats pipeline onto vLLM's own /metrics."""
    with run_scenario("capacity-ceiling", vllm_metrics_port=0) as sc:
        ours = Exposition.scrape(sc.metrics_url)
        theirs = Exposition.scrape(sc.vllm_metrics_url)
    assert theirs.has("vllm:num_requests_running")
    (series,) = theirs.series(S.ROUNDS_AT_ROW_CEILING.name, verdict="vetoed")
    assert set(series[0]) == {S.VLLM_LABEL_MODEL, S.VLLM_LABEL_ENGINE, S.L_VERDICT}
    assert series[0][S.VLLM_LABEL_ENGINE] == "0"
    for m, labels in ((ROUNDS, {"verdict": "vetoed"}), (S.PROMOTIONS.name, {"result": "no_row"}),
                      (S.CASCADES.name, {"result": "completed"}),
                      (S.TRANSFER_BYTES.name, {"rank": "1", "direction": "gpu_to_cpu"})):
        assert theirs.value(m, **labels) == ours.value(m, **labels) > 0, m
    # per-rank labels survive vLLM's aggregation of worker stats
    ranks = {lab["rank"] for lab, _ in theirs.series(S.TRANSFER_BYTES.name)}
    assert {"0", "1", S.RANK_MANAGER} <= ranks
    assert theirs.value(S.LAST_ROUND_PENDING_KEYS.name, verdict="vetoed") == 6
