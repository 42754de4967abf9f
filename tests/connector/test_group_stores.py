"""Stores per KV group (``connector/tiers/group_stores.py``) against what the tiers really hold.

vLLM's real scheduler on CPU with KV groups of 128, 128 and 16 tokens per block
(``kvscope.sim.scenarios.HYBRID_BLOCKS``): the sub-block group stores 8x the keys of each
other group per token. The oracle is the engine itself (``scenarios.group_truth``): the keys
in the primary tier's cache policy and the block files on the fs tier's disk, per group.
"""

from __future__ import annotations

import pytest

from kvscope.exporters import signals as S
from kvscope.sim.scenarios import HYBRID_BLOCKS, group_truth, run_scenario
from tests.connector.support import Exposition

pytestmark = pytest.mark.vllm

STORED, HELD, NO_SPACE = (r.value for r in S.StoreKeyResult)


@pytest.mark.parametrize("name", ["tier-flooded", "healthy-hybrid"])
def test_per_group_stores_are_what_the_tiers_hold(name):
    with run_scenario(name) as sc:
        ex = Exposition.scrape(sc.metrics_url)
        truth = sc.facts
    row = ex.value(S.PRIMARY_ROW_BYTES.name)
    assert row > 0
    stored = [ex.value(S.STORE_KEYS.name, kv_group=str(g), result=STORED) for g in range(3)]
    held = [ex.value(S.STORE_KEYS.name, kv_group=str(g), result=HELD) for g in range(3)]
    for g, block in enumerate(HYBRID_BLOCKS):
        group = str(g)
        # the primary tier's keys of this group, as its cache policy holds them now
        assert ex.value(S.PRIMARY_KEYS.name, kv_group=group) == truth["primary_keys"][g], g
        assert ex.value(S.STORE_TOKENS.name, kv_group=group) == stored[g] * block
        assert ex.value(S.STORE_BYTES.name, kv_group=group) == stored[g] * row
        assert ex.value(S.STORE_KEYS.name, kv_group=group, result=NO_SPACE) == 0
    files, rows = truth["disk_files"], truth["rows"]
    if name == "tier-flooded":
        # only the sub-block group stored, and only its files are on disk
        assert stored[:2] == held[:2] == files[:2] == [0, 0]
        # nothing promoted: every key that left the primary tier was evicted by a store
        assert ex.value(S.PROMOTIONS.name, result="started") == 0
        for g in range(3):
            assert ex.value(S.EVICTED_KEYS.name, kv_group=str(g)) == \
                stored[g] - truth["primary_keys"][g]
        # 4 prompts of 7 chunks on disk; the re-ask stored again the chunks of its prompt the
        # floods had evicted from the primary tier (vLLM's store asks the primary tier only)
        # and found the rest held
        evicted_before = files[2] - rows
        assert files[2] == 4 * 7
        assert stored[2] == files[2] + evicted_before
        assert held[2] == 7 - evicted_before
    else:
        # the re-ask was promoted from disk (its keys then held): each stored key is one file
        assert stored == files
        # the same tokens of every group reached the tiers: in proportion to block sizes
        tokens = {ex.value(S.STORE_TOKENS.name, kv_group=str(g)) for g in range(3)}
        assert len(tokens) == 1 and tokens.pop() == 4 * 256


def test_refused_store_jobs_count_every_group_s_keys():
    """store-never-fits: a whole prompt's store job is larger than the 4-row tier. Each
    refused job's keys count under no_space, per group; no group reached any tier."""
    with run_scenario("store-never-fits") as sc:
        ex = Exposition.scrape(sc.metrics_url)
        truth = group_truth(sc.engine)
    refused = [ex.value(S.STORE_KEYS.name, kv_group=g, result=NO_SPACE) for g in ("0", "1")]
    jobs = ex.value(S.STORE_JOBS.name, result=NO_SPACE)
    assert jobs > 0
    # one KV block size: each refused job holds as many keys of either group
    assert refused[0] == refused[1] >= jobs
    assert truth == {"primary_keys": [0, 0], "disk_files": [0, 0]}
    for g in ("0", "1"):
        assert ex.value(S.STORE_KEYS.name, kv_group=g, result=STORED) == 0
        assert ex.value(S.PRIMARY_KEYS.name, kv_group=g) == 0


def test_one_kv_group_counts_by_lengths_on_the_cpu_tier_alone():
    """One KV group (lengths, no per-key pass), vLLM's CPU manager the only tier: 5 prompts of
    4 chunks into 8 rows. The LRU tier keeps the last 8 keys and evicted the other 12."""
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

    with CPUEngine(EngineConfig(rows=8, tiering=False)) as e:
        for i in range(5):
            e.generate(prompt(10 + i, 64), 4)
            e.drain()
        rec = e.connector.kvscope_recorder
        truth = group_truth(e)
        assert truth == {"primary_keys": [8], "disk_files": [0]}
        assert rec.value(S.PRIMARY_KEYS, ("0",)) == 8
        assert rec.value(S.STORE_KEYS, ("0", STORED)) == 5 * 4
        assert rec.value(S.EVICTED_KEYS, ("0",)) == 5 * 4 - 8
        assert rec.value(S.STORE_TOKENS, ("0",)) == 5 * 64
