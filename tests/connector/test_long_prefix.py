"""A 131,000-token and a 500,000-token prefix restored from disk through tiering, on vLLM's
real scheduler on CPU: 131k is the size at which kvscope lost events on the H200 (its
journal, fed every lookup of every round, outgrew its bound while the restore's rounds were
deferred, and ``kvscope_telemetry_errors_total{where="aggregator"}`` rose, so a healthy
engine read inconclusive), 500k the top of the prefix sizes operators run. The prompt is ~8,190
(~31,250) keys, looked up again on every step while its promotions are in flight (held 40
steps here, as a slow disk would).

Judged by what the engine did: the tokens the re-ask restored, what vLLM's scheduler got
back from each lookup round, which of its keys each tier held before the re-ask (so
which must be promoted from disk) and the keys vLLM handed the fs tier to promote, the
bytes rank 0 loaded; every kvscope gauge of an
unfinished thing (requests, pending transfers, transfers in flight) is 0 once the engine
drains, on the scheduler's endpoint and the rank's. The aggregator thread is kept asleep
(flush_interval_s of an hour), so the journal holds every event of the restore until an
idle step: its peak must stay bounded per round, not per key."""

from __future__ import annotations

import random

import pytest

from kvscope.connector import compat
from kvscope.exporters import signals as S
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig
from kvscope.sim.oracle_truth import request_keys
from tests.connector.support import Exposition, rounds_answered

pytestmark = pytest.mark.vllm

CHUNK = 16
# prompt tokens -> primary rows: one prompt fits the primary tier, two do not
SIZES = {131_000: 9_000, 500_000: 32_000}
HELD_STEPS = 40  # promotions in flight this many steps: as many deferred rounds of every key
# Journal items per step the restore may leave waiting: a round's event is O(KV groups)
# items and a step's its scheduled ids (one request here). A round of copied lookups would
# be 2 x 8,187 items at 131k.
ITEMS_PER_STEP = 40
UNFINISHED = (S.REQUESTS, S.REQUESTS_IN_FLIGHT, S.PENDING_TRANSFERS, S.OLDEST_PENDING_TRANSFER,
              S.TRANSFERS_IN_FLIGHT)


def _prompt(seed: int, tokens: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1, 30_000) for _ in range(tokens)]


def _promotions_submitted(e: CPUEngine) -> list[int]:
    """Keys vLLM's tiering manager hands the fs tier to promote from here on (its load
    jobs' keys): the engine's truth of what came from disk."""
    n = [0]
    for tier in compat.secondary_tiers(e.connector.connector_scheduler.manager):
        submit = tier.submit_load

        def counted(job, *a, _submit=submit, **kw):
            n[0] += len(compat.job_keys(job))
            return _submit(job, *a, **kw)

        tier.submit_load = counted
    return n


@pytest.mark.parametrize("tokens", sorted(SIZES), ids=lambda t: f"{t // 1000}k")
def test_a_long_prefix_restored_from_disk_loses_no_event(tokens):
    keys_loadable = tokens // CHUNK  # full chunks: the loadable prefix (8,187 at 131k)
    cfg = EngineConfig(rows=SIZES[tokens], tiering=True, num_gpu_blocks=keys_loadable + 200,
                       max_num_batched_tokens=8192, max_num_seqs=4, max_model_len=tokens + 64,
                       promotion_delay_steps=HELD_STEPS, exporter_port=0,
                       kvscope_options={"flush_interval_s": 3600.0})
    with CPUEngine(cfg) as e:
        observer = e.connector._kvscope_observer
        first = e.generate(_prompt(0, tokens), 4, max_steps=1_000)
        e.generate(_prompt(1, tokens), 4, max_steps=1_000)  # evicts it from the GPU and the CPU tier
        e.drain(max_steps=1_000)
        # per-key truth before the re-ask: which of its keys the primary tier and the fs
        # tier hold (the tiers' own state)
        keys = request_keys(e, _prompt(0, tokens))[0]
        manager = e.connector.connector_scheduler.manager
        in_primary = [compat.primary_holds(manager, k) for k in keys]
        on_disk = [any(compat.secondary_holds(t, k) for t in compat.secondary_tiers(manager))
                   for k in keys]
        submitted = _promotions_submitted(e)
        before = Exposition.scrape(e.connector.kvscope_exporter.url)
        rank0_before = Exposition.scrape(e.ranks[0].connector.kvscope_exporter.url)
        answers = rounds_answered(e)
        peak = [0]

        def journal_peak(engine: CPUEngine) -> None:
            peak[0] = max(peak[0], len(observer.journal))

        rid = e.add_request(_prompt(0, tokens), 4)
        steps = e.run_until_done([rid], max_steps=1_000, on_step=journal_peak)
        e.drain(max_steps=1_000)
        again = e.finished[rid]

        # engine truth: the whole loadable prefix came back, the blocks the GPU no longer
        # held loaded from the tiers (from disk: the primary tier does not hold two
        # prompts), and the output is the first ask's
        assert again.num_cached_tokens == keys_loadable * CHUNK
        assert again.output == first.output
        deferred, loaded = answers.count(None), answers[-1]
        assert deferred >= HELD_STEPS - 2 and loaded > 0.9 * keys_loadable * CHUNK
        local = keys_loadable - loaded // CHUNK  # blocks the GPU prefix cache still had
        assert all(on_disk[local:])
        # promoted from disk: at least every loaded key the primary tier lacked, at most
        # every loaded key (the restore's own promotions may evict rows it then needs)
        promoted = submitted[0]
        assert in_primary[local:].count(False) <= promoted <= keys_loadable - local

        assert peak[0] <= ITEMS_PER_STEP * steps, (peak[0], steps)
        after = Exposition.scrape(e.connector.kvscope_exporter.url)
        rank0 = Exposition.scrape(e.ranks[0].connector.kvscope_exporter.url)
        assert after.value(S.TELEMETRY_ERRORS.name) == 0
        assert rank0.value(S.TELEMETRY_ERRORS.name) == 0

        def grew(ex, old, name, **labels) -> float:
            return ex.value(name, **labels) - old.value(name, **labels)

        # kvscope's counters equal what the engine did during the re-ask
        assert grew(after, before, S.HIT_TOKENS.name) == loaded
        assert grew(after, before, S.LOOKUP_ROUNDS.name, verdict="deferred") == deferred
        assert grew(after, before, S.LOOKUP_ROUNDS.name, verdict="hit") == 1
        assert grew(after, before, S.LOOKUP_ROUNDS.name) == len(answers)
        assert grew(after, before, S.PROMOTIONS.name, result="completed") == promoted
        per_block = observer.geometry.row_stride  # world size 1: a row is rank 0's block
        assert grew(rank0, rank0_before, S.TRANSFER_BYTES.name, rank="0",
                    direction="cpu_to_gpu") == loaded // CHUNK * per_block
        # nothing unfinished once the engine drained
        for ex in (after, rank0):
            for metric in UNFINISHED:
                left = [(lab, v) for lab, v in ex.series(metric.name) if v]
                assert not left, (metric.name, left)
