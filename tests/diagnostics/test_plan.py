"""kv-diagnose plan: parser, coverage model and formatter apart (ray-status style), the CLI.

The window below is what a CPU engine of the plan's check exported (``kvscope.sim.plan_workload``:
24 prompts of 2,048 tokens re-asked at once, twice, on 1,536 rows: half of them restored whole).
Its engine-level counterpart, against vLLM's scheduler: ``tests/connector/test_plan_verify.py``.

Regenerate the golden files after an intended change:
KVSCOPE_UPDATE_GOLDEN=1 pytest tests/diagnostics/test_plan.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvscope.diagnostics.cli import main
from kvscope.diagnostics.evidence.build import build_evidence
from kvscope.diagnostics.model import DiagnoseError
from kvscope.diagnostics.plan.coverage import (
    coverage_at,
    group_rows,
    make_plan,
    partial_reach,
    rows_per_restore,
)
from kvscope.diagnostics.plan.format import format_plan, plan_to_dict
from kvscope.diagnostics.plan.inputs import Given, read_inputs
from kvscope.diagnostics.plan.model import Fact, PlanInputs
from kvscope.diagnostics.sources.bundle import read_bundle, write_bundle
from kvscope.exporters import signals as S

from .support import T0, L, base, info, window

GOLDEN = Path(__file__).parent / "golden"
FIXTURES = Path(__file__).parent / "fixtures"


def concurrency_window(rows: int = 1536, *, loss: int = 49_152, other: int = 0,
                       vllm: str = "0.26.0") -> dict:
    d = base(rows=rows)
    d.pop(info(rows=rows))
    labels = dict(info(rows=rows, checksum_policy="refuse", chunk_tokens="16",
                       max_num_batched_tokens="256", world_size="1")[1]) | {"vllm_version": vllm}
    d[L(S.INFO.name, **labels)] = [1, 1]
    held = 98_304
    d |= {
        S.HIT_TOKENS.name: [held - loss - other] * 2,
        S.RESTORE_HELD_TOKENS.name: [held] * 2,
        S.RESTORE_COVERAGE.name + "_count": [48, 48],
        S.RESTORE_COVERAGE.name + "_sum": [24, 24],
        L(S.RESTORE_SHORT_TOKENS.name, reason="row_ceiling"): [loss] * 2,
        L(S.RESTORE_SHORT_ROUNDS.name, reason="row_ceiling"): [loss // 2048] * 2,
        L(S.RESTORE_SHORT_TOKENS.name, reason="load_cap"): [other] * 2,
        L(S.RESTORE_CEILING_ROUNDS.name, form="concurrent"): [loss // 2048] * 2,
        S.LAST_CEILING_ROWS_NEEDED.name: [128, 128],
        S.LAST_CEILING_HELD_TOKENS.name: [2048, 2048],
        S.LAST_CEILING_OFFERED_TOKENS.name: [0, 0],
        S.LAST_CEILING_CONCURRENT_REQUESTS.name: [13, 13],
        S.LAST_CEILING_CONCURRENT_ROWS.name: [1664, 1664],
        S.PRIMARY_ROW_BYTES.name: [4096, 4096],
    }
    return d


def _plan(values: dict, target: float = 0.99, **given):
    return make_plan(read_inputs(build_evidence(window(values)), Given(**given)), target)


def _check(name: str, got: str) -> None:
    path = GOLDEN / name
    if os.environ.get("KVSCOPE_UPDATE_GOLDEN"):
        path.write_text(got)
    assert path.exists(), f"{path} missing: run with KVSCOPE_UPDATE_GOLDEN=1"
    assert got == path.read_text()


# ---- the parser ----------------------------------------------------------------------------
def test_parser_reads_held_prefixes_concurrency_and_geometry_with_their_sources():
    i = read_inputs(build_evidence(window(concurrency_window())))
    assert (i.restores.value, i.held_per_restore.value) == (48, 2048)
    assert i.restores.source == "kvscope_restore_coverage_ratio_count"
    assert i.largest_rows.value == 128 and "rows_needed" in i.largest_rows.source
    assert i.concurrency_seen.value == 13
    assert (i.coverage_now.value, i.row_loss.value, i.other_loss.value) == (0.5, 0.5, 0.0)
    assert (i.chunk_tokens.value, i.kv_groups.value, i.rows_now.value) == (16, 1, 1536)
    assert (i.row_bytes.value, i.step_tokens.value) == (4096, 256)
    assert i.notes == ()


def test_restoring_requests_count_as_concurrency_seen_sample_by_sample():
    d = concurrency_window() | {
        L(S.REQUESTS.name, state="deferred"): [20, 3],
        L(S.REQUESTS.name, state="loading"): [1, 15],
    }
    i = read_inputs(build_evidence(window(d)))
    assert i.concurrency_seen.value == 21  # 20 + 1 at the first sample; 18 at the second
    assert "kvscope_requests" in i.concurrency_seen.source


def test_the_most_restores_any_cut_round_saw_beats_the_latest_cut():
    # The first cut saw 30 restores at once, the latest (after the first loads) only 13:
    # the histogram's lowest bucket holding every observation of the window bounds it.
    h = S.CEILING_CONCURRENT_REQUESTS.name + "_bucket"
    cum = {"16.0": 1, "20.0": 1, "24.0": 1, "28.0": 1, "32.0": 3, "+Inf": 3}
    d = concurrency_window() | {L(h, le=le): [0, v] for le, v in cum.items()}
    i = read_inputs(build_evidence(window(d)))
    assert i.concurrency_seen.value == 32 and "bucket" in i.concurrency_seen.source
    assert make_plan(i).concurrency == 32  # above the 24 the cut's coverage explains
    # a window that is not the process lifetime: only the increase in it counts
    old = concurrency_window() | {L(h, le=le): [v, v] for le, v in cum.items()}
    assert read_inputs(build_evidence(window(old, lifetime=False))).concurrency_seen.value == 13


def test_the_command_line_replaces_the_window():
    i = read_inputs(build_evidence(window(concurrency_window())),
                    Given(held_tokens=4096, concurrency=5, row_bytes=8192, rows=100))
    assert (i.held_per_restore.value, i.held_per_restore.source) == (4096, "--held-tokens")
    assert i.concurrency_given.value == 5 and i.rows_now.source == "--rows"
    assert i.row_bytes.value == 8192


# ---- the model -----------------------------------------------------------------------------
def test_rows_per_restore_is_a_row_per_chunk_per_kv_group():
    assert rows_per_restore(2048, 16, 1) == 128
    assert rows_per_restore(2049, 16, 2) == 2 * 129  # a partial chunk takes a row
    assert rows_per_restore(440_000, 1982, 1) == 222


def test_a_sliding_window_group_that_promotes_its_window_counts_the_window_alone():
    # a Gemma2-style model (a full group, a sliding-window one of 8 chunks: 9 with a partial
    # last one) on vLLM 0.33+: the window's rows, scanned after the full group
    per_group = group_rows(1024, 16, 2, (9,))
    assert per_group == [64, 9] and rows_per_restore(1024, 16, 2, (9,)) == 73
    assert partial_reach(per_group) == 65  # the full group whole, the window's first chunk
    assert group_rows(100, 16, 2, (9,)) == [7, 7]  # a prefix shorter than the window
    assert group_rows(1024, 16, 1, (9,)) == [9]  # every group windowed
    # groups of equal rows: every group but the last whole, the last's first chunk
    assert partial_reach(group_rows(1024, 16, 2)) == 65
    assert partial_reach(group_rows(1024, 16, 1)) == 1


@pytest.mark.parametrize("rows, predicted, at_least", [
    (1536, 12 / 24, 12 / 24),   # 12 restores whole, the rest cut: the window's 50 %
    (2779, 22 / 24, 21 / 24),   # 21 found every row; a 22nd found part of them and waits
    (3072, 1.0, 1.0),           # every restore at once
    (100, 100 / 128 / 24, 0.0),  # not one restore fits: truncated at best, or livelocked
])
def test_coverage_of_a_row_count(rows, predicted, at_least):
    assert coverage_at(rows, 128, 24) == pytest.approx((predicted, at_least))


def test_plan_is_every_restore_at_once_the_last_waiting_plus_one_steps_stores():
    p = _plan(concurrency_window())
    # C: 12 restores fit 1,536 rows whole and left 50 %: 24 ask at once (13 seen)
    assert (p.rows_per_restore, p.concurrency, p.restores_needed, p.reserve) == (128, 24, 24, 16)
    # every restore whole: none recomputed, so the 24th finds one row and waits for the rest
    assert p.rows == 23 * 128 + 1 + 16 and p.cpu_bytes == p.rows * 4096
    assert not p.partial_cut
    got = {x.label: (x.rows, x.coverage, x.measured) for x in p.predictions}
    assert got["now"] == (1536, 0.5, 0.5)  # the model explains the window it was fit to
    assert got["plan"][1] == 1.0
    assert got["plan - 10%"] == (2664, 21 / 24, None)  # 20 found every row, the 21st waits


def test_a_lower_target_needs_fewer_restores_whole():
    p = _plan(concurrency_window(), target=0.75)
    assert p.restores_needed == 18 and p.rows == 18 * 128 + 16


def test_losses_rows_do_not_fix_make_a_target_out_of_reach():
    p = _plan(concurrency_window(other=4_000))  # 4 % lost to vLLM's load cap
    assert not p.reachable and p.restores_needed == p.concurrency
    assert any("out of reach" in x for x in p.notes)
    assert _plan(concurrency_window(other=4_000), target=0.9).reachable


def test_the_seed_sizing_two_fit_three_do_not():
    """One 440k-token prefix needs 222 rows; 498 rows hold two restores at once, not three.
    With one KV group the third finds 54 rows, is deferred and waits for the two loads to
    free the rest (restored late, whole): the plan holds two and the third's first row."""
    p = make_plan(read_inputs(None, Given(held_tokens=440_000, chunk_tokens=1982,
                                          concurrency=3, rows=498, reserve_rows=8)))
    assert p.rows_per_restore == 222 and p.rows == 2 * 222 + 1 + 8
    now = next(x for x in p.predictions if x.label == "now")
    assert (now.coverage, now.at_least) == pytest.approx((1.0, 2 / 3))


def test_a_partial_restore_that_misses_a_group_is_cut():
    """Two KV groups of 111 chunks: the third restore's 54 rows all go to group 0's scan,
    group 1 finds no row at its first chunk and vetoes the request (the cross-group AND);
    with 120 rows left group 1 gets 9 and the request waits for the rest."""
    def now(rows: int):
        p = make_plan(read_inputs(None, Given(held_tokens=220_000, chunk_tokens=1982, kv_groups=2,
                                              concurrency=3, rows=rows, reserve_rows=8)))
        assert p.rows_per_restore == 222
        return next(x for x in p.predictions if x.label == "now")

    assert (now(498).coverage, now(498).at_least) == pytest.approx((2 / 3, 2 / 3))
    assert (now(564).coverage, now(564).at_least) == pytest.approx((1.0, 2 / 3))


def test_no_restore_in_the_window_cannot_be_planned_without_held_tokens():
    d = base(rows=8) | {S.RESTORE_HELD_TOKENS.name: [0, 0]}
    with pytest.raises(DiagnoseError, match="--held-tokens"):
        _plan(d)
    p = _plan(d, held_tokens=160, concurrency=2, chunk_tokens=16)
    assert p.rows == 10 + 1  # the second waits; no max_num_batched_tokens here: no headroom
    assert any("max_num_batched_tokens unknown" in x for x in p.notes)


def test_a_healthy_window_says_its_rows_already_reach_the_target():
    p = _plan(concurrency_window(loss=0))
    assert any("already reaches the target" in x for x in p.notes)


def test_a_vllm_release_the_model_was_not_checked_on_is_flagged():
    assert not any("coverage model was checked" in x  # checked on CPU
                   for x in _plan(concurrency_window(vllm="0.33.0")).notes)
    p = _plan(concurrency_window(vllm="0.35.0"))
    assert any("vLLM 0.35.0: the coverage model was checked on vLLM 0.26, 0.33 and 0.34" in x
               for x in p.notes)


def _inputs(**over) -> PlanInputs:
    base = dict(source=None, chunk_tokens=Fact(16, "t"), kv_groups=Fact(1, "g"),
                rows_now=Fact(9_000, "r"), row_bytes=Fact(32_768, "b"),
                step_tokens=Fact(8_192, "s"), restores=Fact(4, "n"),
                held_per_restore=Fact(64_000, "h"), largest_rows=None,
                concurrency_seen=Fact(4, "seen"), concurrency_given=None,
                coverage_now=Fact(0.5, "c"), row_loss=Fact(0.5, "l"), other_loss=Fact(0.0, "o"),
                reserve_given=None)
    return PlanInputs(**{**base, **over})


def test_the_partial_restore_cut_in_the_window_sizes_the_plan_for_the_restores_seen():
    """One H200's window (vLLM 0.26): four 64,000-token re-asks at once through 9,000 rows
    (k = 4,000) restored 2 of 4 whole, the first asker cut too. "The partial restore waits"
    counts 3 whole and needs C = 6 to explain 50 %; "it was cut" counts 2 and needs the 4
    seen. The engine at each size: 24,512 rows and 22,060 restored 4 of 4, and so did
    16,512 = 4 x 4,000 + 512 and 12,256 = 3 x 4,000 + 256 (the last waited: nobody was
    recomputed); 12,000 restored 2 or 3 of 4 (one recomputed). So the plan holds three and
    the fourth's first row, plus one step's stores: 12,513."""
    p = make_plan(_inputs())
    assert p.concurrency == 4 and p.partial_cut
    assert p.rows == 3 * 4_000 + 1 + 512
    by_label = {x.label: x for x in p.predictions}
    assert by_label["now"].coverage == 0.5  # the window's own: 2 of 4
    assert by_label["plan"].coverage == 1.0
    # 2 whole, a third partial, the fourth recomputed: the partial one is cut, as it was
    # in the window
    assert by_label["plan - 10%"].coverage == 0.5
    assert not any("more than the" in x for x in p.notes)


def test_a_c_above_the_restores_seen_is_said():
    """The same window with one restore seen at once: no reading explains 50 % with C = 1,
    so C comes from the coverage, and the plan says it exceeds what the window showed."""
    p = make_plan(_inputs(concurrency_seen=Fact(1, "seen"), restores=Fact(40, "n")))
    assert p.concurrency == 6  # 3 whole (the partial one waiting) / 50 %
    assert any("more than the 1 seen at once" in x for x in p.notes)


def test_c_is_never_more_than_the_restores_in_the_window():
    """That C is 6 only where the window had 6 restores or more: with the 4 it had, no 6
    asked at once, and the plan sizes for 4 and says why."""
    p = make_plan(_inputs(concurrency_seen=Fact(1, "seen")))
    assert p.concurrency == 4
    assert any("more than the 4 the window had" in x for x in p.notes)
    assert any("more than the 1 seen at once" in x for x in p.notes)


def test_stores_holding_rows_in_the_window_are_not_read_as_more_restores_at_once():
    """One H100's window (vLLM 0.26, a Gemma2-style model, two KV groups): twelve
    6,000-token re-asks at once through 2,250 rows (k = 2 x 375 = 750) restored 2 whole,
    not the 3 that fit: one step's store job (512 rows) held rows while they asked. Read
    as "3 fit", 16.7 % needs C = 18 and planned 13,638 rows; the engine restored all twelve
    whole at 13,638, at 12,274 and at 10,910 (plan_verify_h100_6befd4f_c12_6k_g2.json)."""
    p = make_plan(_inputs(kv_groups=Fact(2, "g"), rows_now=Fact(2_250, "r"),
                          row_bytes=Fact(16_384, "b"), step_tokens=Fact(4_096, "s"),
                          restores=Fact(12, "n"), held_per_restore=Fact(6_000, "h"),
                          concurrency_seen=Fact(12, "seen"), coverage_now=Fact(2 / 12, "c"),
                          row_loss=Fact(10 / 12, "l")))
    assert (p.rows_per_restore, p.window_store_rows) == (750, 512)
    assert p.concurrency == pytest.approx(12)
    assert not p.partial_cut and not any("more than the" in x for x in p.notes)
    assert p.rows == 11 * 750 + 376 + 512  # the last one's first group whole, one chunk more
    assert any("in-flight stores held one step's rows" in s.how for s in p.steps)
    by_label = {x.label: x for x in p.predictions}
    assert by_label["now"].coverage == pytest.approx(2 / 12)  # the window's own
    assert by_label["plan"].coverage == 1.0
    # the engine's sizes: every re-ask whole at each
    for rows in (10_910, 12_274, 13_638):
        assert coverage_at(rows, 750, 12, 0.0, 376, False, 512)[0] == 1.0
    assert by_label["plan - 10%"].coverage < 0.99


def test_stores_are_not_read_into_a_window_the_restores_explain():
    """The H200 window above (four 64,000-token re-asks through 9,000 rows): the cut
    partial restore explains it with the 4 seen, so no store rows are taken off."""
    assert make_plan(_inputs()).window_store_rows == 0


# ---- the formatter: golden text, fixed clock ----------------------------------------------
def test_golden_text_from_a_window():
    _check("plan_concurrency.txt", format_plan(_plan(concurrency_window()), now=T0 + 1))


def test_golden_text_from_the_command_line():
    p = make_plan(read_inputs(None, Given(held_tokens=440_000, chunk_tokens=1982, concurrency=3,
                                          rows=498, row_bytes=2 << 20, reserve_rows=8)))
    _check("plan_command_line.txt", format_plan(p, now=T0 + 1))


def test_json_carries_the_plan_inputs_and_predictions():
    d = plan_to_dict(_plan(concurrency_window()))
    assert (d["kind"], d["rows"], d["concurrency"], d["partial_cut"]) == ("plan", 2961, 24, False)
    assert d["inputs"]["held_per_restore"] == {
        "value": 2048.0, "source": "kvscope_restore_held_tokens_total / restores"}
    assert [p["at"] for p in d["predictions"]] == ["now", "plan - 10%", "plan"]
    json.dumps(d)


# ---- the CLI -------------------------------------------------------------------------------
def test_cli_plans_from_a_bundle(tmp_path, capsys):
    path = tmp_path / "w.kvb"
    write_bundle(window(concurrency_window()), str(path))
    assert main(["plan", "--bundle", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("======== kv-diagnose plan: ")
    assert "primary rows      2,961 (now 1,536)" in out
    assert main(["plan", "--bundle", str(path), "--json", "--target", "75%"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 18 * 128 + 16


def test_cli_exit_codes(tmp_path, capsys):
    path = tmp_path / "w.kvb"
    write_bundle(window(concurrency_window(other=4_000)), str(path))
    assert main(["plan", "--bundle", str(path)]) == 3  # out of reach with rows alone
    assert main(["plan"]) == 2
    assert "needs --held-tokens, --concurrency, --chunk-tokens" in capsys.readouterr().err
    assert main(["plan", "--bundle", str(path), "--target", "lots"]) == 2
    assert main(["plan", "--since", "1h", "--held-tokens", "1", "--concurrency", "1",
                 "--chunk-tokens", "16"]) == 2
    assert main(["plan", "--held-tokens", "0", "--concurrency", "1", "--chunk-tokens", "16"]) == 2


def test_a_recorded_concurrency_scenario_is_planned():
    """The demo's concurrency scenario (recorded from the CPU harness): 3 restores of 8 rows
    ask at once, 12 rows; the plan holds two and the third's first row (it waits)."""
    p = make_plan(read_inputs(build_evidence(read_bundle(str(FIXTURES / "concurrency.kvb")))))
    assert (p.rows_per_restore, p.concurrency, p.rows) == (8, 3, 2 * 8 + 1 + 1)
    now = next(x for x in p.predictions if x.label == "now")
    # 1 found every row, the 2nd found part of them and waited for the rest: as predicted
    assert now.at_least < now.measured == pytest.approx(now.coverage)
