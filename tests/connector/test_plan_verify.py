"""``kv-diagnose plan`` against vLLM's scheduler (CPU harness): the planned rows must reach
the target coverage, 10 % fewer must miss it, and the predicted coverage must be within 5
points of the engine's at both sizes.

The CI-sized run of the plan check benchmark, ``plan_verify.py`` (which re-asks 32 prompts of 2,048 tokens
at once): 24 prompts of 1,024 tokens re-asked at once, from a window engine at half the rows
they need together. Coverage measured is the engine's truth (tokens vLLM loaded for each
re-ask / tokens the tiers held for its prefix), never kvscope's counters; the plan is read
from kvscope's exporter by the same parser and model as the CLI. With 24 restores at once,
coverage moves in steps of 1/24 = 4.2 points: two restores more or fewer than the model
says fail the 5-point bound.

With promotions that complete two steps late (a slower disk, as on the H200), the window
looks healthier than the demand: the restores that find no free row stay deferred, the cut
ones' recompute fills the steps, and by the time those are asked again the first restores'
loads have freed their rows (restored whole, later). The last cut round saw fewer restores
at once than the first; the plan reads the most any cut round saw
(``kvscope_ceiling_round_concurrent_requests``). Read from the latest cut alone, the plan
came out at 912 rows and restored 87.5 % there (the H200's failure, reproduced).
"""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")

from kvscope.sim.plan_workload import Workload, verify_cpu  # noqa: E402

# vLLM 0.26 (the GPU machines' release) cuts first come, first served, and the restore that
# found part of its rows waits for the rest: the measured coverage is at least the model's
# count without that one, and every re-ask ends. vLLM 0.33 orders the cut otherwise: at 10 %
# fewer rows with promotions done by the next step it can leave the first re-ask deferred
# for good (each step it promotes two of its last three chunks, and the promotion evicts the
# third, its own: docs/measured-facts.md), a round that never ends, left out of the coverage
# and counted apart; there only the 5-point bound, and every re-ask ending at the plan's
# rows (a check of doc["passed"]).
ON_026 = vllm.__version__.startswith("0.26.")


@pytest.mark.vllm
@pytest.mark.parametrize("delay", [0, 2], ids=["promotions-next-step", "promotions-2-steps-late"])
def test_planned_rows_reach_the_target_and_ten_percent_fewer_miss(delay):
    work = Workload(concurrency=24, prompt_tokens=1024, waves=1, promotion_delay_steps=delay)
    doc = verify_cpu(work, target=0.99)
    plan, sizes = doc["plan"], doc["sizes"]
    # the incident the plan reads: short of the target. On vLLM 0.26 with promotions done by
    # the next step, exactly half the restores whole at half the rows (the harness collects
    # the fs tier's jobs as of each step's end, in submission order: before that, a loaded
    # machine's I/O threads gave 11 to 21 of 24, with stock vLLM too); with promotions late
    # (rows freed in time for later restores), or on 0.33 (a restore finding no free row
    # waits), more, still short of it
    if ON_026 and delay == 0:
        assert doc["window"]["restores_whole"] == 12, doc["window"]
    else:
        assert 0.5 < doc["window"]["coverage"] < 0.99
    assert (plan["rows_per_restore"], plan["concurrency"]) == (64, 24), doc["plan_text"]
    # every restore whole: none is recomputed, the 24th finds one row and waits for the rest
    assert plan["rows"] == 23 * 64 + 1 + 16
    assert sizes["plan"]["measured"] >= 0.99, sizes
    assert sizes["plan - 10 %"]["measured"] < 0.99, sizes
    for label, s in sizes.items():
        assert s["error"] <= 0.05, (label, s)
        if ON_026:
            assert s["at_least_held"], (label, s)  # not below the count without the waiting one
            assert s["unfinished"] == 0, (label, s)  # every re-ask ended (restored or cut)
    assert doc["passed"], doc["checks"]


@pytest.mark.vllm
@pytest.mark.parametrize("groups, left", [(1, 10), (2, 40), (2, 100)],
                         ids=["one-group", "two-groups-second-finds-none", "two-groups-both-found"])
def test_the_restore_finding_part_of_its_rows_waits_unless_a_group_found_none(groups, left):
    """The model's whole-restore count against the engine at its edge: 4 prompts of 1,024
    tokens re-asked at once, rows for 3 whole and ``left`` more. The 4th re-ask's scan
    promotes into the ``left`` rows group by group (64 chunks each): with one group it is
    deferred and waits for the others' loads; with two, 40 rows all go to group 0 and group 1
    finds no row at its first chunk (the cross-group AND cuts it: recomputed), 100 reach
    group 1 and it waits. On vLLM 0.33 the cut one's promotions and stores leave the other
    three deferred for good (a livelock kv-diagnose names:
    tests/connector/test_livelock_own_rows.py): those never end, and are counted apart."""
    from kvscope.diagnostics.plan.coverage import partial_reach, restores_whole
    from kvscope.sim.plan_workload import run_cpu

    work = Workload(concurrency=4, prompt_tokens=1024, kv_groups=groups)
    k = groups * work.chunks
    rows = 3 * k + left
    run = run_cpu(work, rows).as_dict()
    wave = run["waves"][0]
    reach = partial_reach([work.chunks] * groups)
    waits = restores_whole(rows, k, reach) == 4
    # the partial one (asked last): ended, whole when it waits, recomputed when cut
    assert wave["ended"][3] and wave["restored"][3] == (1024 if waits else 0), wave
    # the three that found every row: restored whole, or (0.33, the cut case) never ended
    assert all(r == 1024 or (not ON_026 and not waits and not e)
               for r, e in zip(wave["restored"][:3], wave["ended"][:3], strict=True)), wave
    if ON_026:
        assert run["unfinished"] == 0 and run["restores_whole"] == restores_whole(rows, k, reach)


@pytest.mark.vllm
def test_a_window_with_fewer_whole_restores_than_its_rows_hold_is_planned_for_its_restores():
    """Twelve 6,000-token re-asks at once, two KV groups (k = 2 x 375 = 750 rows), from a
    window engine at 2,250 rows: ⌊2,250 / 750⌋ = 3 fit, yet fewer ended whole (the steps'
    stores held rows while they asked: 1 here, 2 on an H100). Read as more restores asking at
    once, the window explained its coverage with C = 36 here (a plan of 27,138 rows; C = 18
    and 13,638 on the H100, where 10,910 restored all twelve). C is at most the restores the
    window had: the plan is for the twelve, every one whole, and 10 % fewer miss. On vLLM
    0.34 the restores that find no row wait (HIT_PENDING) and take rows the first loads free:
    that window restored 4 whole, more than fit, and the same plan follows from it."""
    work = Workload(concurrency=12, prompt_tokens=6000, step_tokens=4096, kv_groups=2)
    doc = verify_cpu(work, target=0.99)
    plan, sizes = doc["plan"], doc["sizes"]
    assert doc["window"]["rows"] == 2250
    if ON_026:  # the shape: fewer whole than fit
        assert doc["window"]["restores_whole"] < 3, doc["window"]
    assert (plan["rows_per_restore"], plan["concurrency"]) == (750, 12), doc["plan_text"]
    assert plan["rows"] == 11 * 750 + 376 + 512  # the last one's first group whole, + stores
    assert sizes["plan"]["measured"] >= 0.99, sizes
    assert sizes["plan"]["unfinished"] == 0, sizes
    assert sizes["plan - 10 %"]["measured"] < 0.99, sizes


@pytest.mark.vllm
def test_a_sliding_window_group_is_planned_as_the_release_restores_it():
    """A Gemma2-style model (a full-attention group, a sliding-window group of 128 tokens):
    6 prompts of 1,024 tokens re-asked at once. On vLLM 0.33+ a promotion the window scan
    started counts toward the window, so a restore promotes the window's chunks of that group
    alone (one re-ask ended whole in 72 rows there); on 0.26 the scan promotes every chunk it
    passes, and six at once need a row per chunk of both groups (700 rows restored 5 of 6).
    The plan reads which from kvscope_kv_group_info{restore_chunks}: planned as two full
    groups on 0.33+, it asked for 737 rows where 462 restore all six."""
    work = Workload(concurrency=6, prompt_tokens=1024, kv_groups=2, sliding_window=128)
    doc = verify_cpu(work, target=0.99)
    plan, sizes = doc["plan"], doc["sizes"]
    window = 0 if ON_026 else 128 // 16 + 1
    assert plan["restore_caps"] == ([window] if window else []), doc["plan_text"]
    assert plan["rows_per_restore"] == 64 + (window or 64), doc["plan_text"]
    # judged by the engine: the plan restores every re-ask whole, 10 % fewer rows do not
    assert sizes["plan"]["measured"] >= 0.99 and sizes["plan"]["unfinished"] == 0, sizes
    assert sizes["plan - 10 %"]["measured"] < 0.99, sizes
