"""The oracle's truth rules on hand-made facts (the matrix runs them on real engines)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from kvscope.sim.oracle_truth import (  # noqa: E402
    RequestTruth,
    classify,
    expected_verdicts,
    held_tokens,
    restore_keys,
)

CHUNK = 16


def _keys(groups: int, chunks: int) -> list[list[bytes]]:
    return [[bytes([g, i]) for i in range(chunks)] for g in range(groups)]


def test_held_is_the_cross_group_and_of_stored_prefixes():
    keys = _keys(2, 6)
    stored = {k for k in keys[0]} | set(keys[1][:4])  # group 1 lacks chunks 4 and 5
    assert held_tokens(keys, stored.__contains__, 96, CHUNK, None) == 64
    assert held_tokens(keys, set().__contains__, 96, CHUNK, None) == 0


def test_held_with_a_sliding_window_group_stops_a_token_short_and_needs_a_window():
    keys = _keys(2, 6)
    stored = set(keys[0]) | {keys[1][4], keys[1][5]}  # window of 2 at the end
    # vLLM: the last prompt token is recomputed when a sliding-window group exists
    assert held_tokens(keys, stored.__contains__, 96, CHUNK, 2) == 95
    stored.discard(keys[1][4])  # no full window left anywhere
    assert held_tokens(keys, stored.__contains__, 96, CHUNK, 2) == 0


def test_restore_keys_start_past_the_gpu_prefix_cache_hit():
    keys = _keys(2, 6)
    assert len(restore_keys(keys, 96, CHUNK)) == 12
    assert len(restore_keys(keys, 96, CHUNK, local=32)) == 8


def _req(held, need, served, restored, stored_first=1, finished=True):
    keys = frozenset(range(need))
    return RequestTruth(held=held, need_keys=keys, stored_first=stored_first, prompt_keys=6,
                        served=served, restored=restored, finished=finished)


@pytest.mark.parametrize("reqs, rows, truth", [
    ([_req(96, 6, 96, 96)], 8, "healthy"),
    ([_req(96, 12, 0, 0)], 8, "veto"),
    ([_req(96, 12, 48, 48)], 8, "truncated"),
    ([_req(96, 6, 0, 0)], 8, "short_unexplained"),
    ([_req(96, 6, 0, 0, finished=False)], 8, "livelock"),
    ([_req(0, 0, 0, 0, stored_first=0)], 8, "never_stored"),
])
def test_truth_classes(reqs, rows, truth):
    assert classify(reqs, rows, pending_at_end=False, kv_groups=2)[0] == truth


def test_concurrency_needs_requests_that_fit_alone_and_not_together():
    a = RequestTruth(held=96, need_keys=frozenset(range(6)), stored_first=6, prompt_keys=6,
                     served=96, restored=96, finished=True)
    b = RequestTruth(held=96, need_keys=frozenset(range(6, 12)), stored_first=6, prompt_keys=6,
                     served=0, restored=0, finished=True)
    assert classify([a, b], 8, False, kv_groups=2)[0] == "concurrency"
    assert classify([a, b], 12, False, kv_groups=2)[0] == "short_unexplained"  # they fit together
    big = RequestTruth(held=96, need_keys=frozenset(range(20, 30)), stored_first=6,
                       prompt_keys=10, served=0, restored=0, finished=True)
    truth = classify([a, b, big], 8, False, kv_groups=2)[0]
    assert truth == "veto+concurrency"
    assert expected_verdicts(truth) == {"capacity_ceiling_veto", "capacity_ceiling_concurrency"}


def test_a_prompt_partly_lost_to_refused_stores_is_never_stored():
    r = _req(32, 2, 32, 32)  # restored all the tiers held ...
    assert classify([r], 8, False, kv_groups=2)[0] == "healthy"
    r.lost_first = True  # ... but with tiering part of the prompt reached no tier
    truth, why = classify([r], 8, False, kv_groups=2)
    assert truth == "never_stored"
    assert why == ("1 prompt(s) stored only in part after the first ask (e.g. 1 of 6 keys; a "
                   "full-attention chunk reached no tier)")
    r.served = r.restored = 0  # and what was stored was not restored either (needs 2 > 1 row)
    assert classify([r], 1, False, kv_groups=2)[0] == "never_stored+veto"


def test_output_and_pending_rank_first():
    r = _req(96, 6, 96, 96)
    assert classify([r], 8, pending_at_end=True, kv_groups=2)[0] == "pending_at_idle"
    r.same_output = False
    assert classify([r], 8, pending_at_end=True, kv_groups=2)[0] == "wrong_output"
    assert expected_verdicts("short_unexplained") is None


def test_a_restore_cut_to_zero_with_one_kv_group_is_truncated_not_vetoed():
    """No cross-group AND with one KV group: its restore stopped at the first chunk
    whose promotion found no row (0 tokens), the truncated form at its floor."""
    r = _req(96, 12, 0, 0)
    assert classify([r], 8, False, kv_groups=1)[0] == "truncated"
    assert classify([r], 8, False, kv_groups=2)[0] == "veto"
    assert classify([_req(0, 0, 0, 0, stored_first=0)], 8, False, kv_groups=1)[1] == \
        "1 prompt(s) left no chunk in any tier after the first ask"
