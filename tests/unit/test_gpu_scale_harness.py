"""The restore benchmarks' harness (the GPU scale benchmark's schedule, fs-tier pruning,
drain log and summary: ``kvscope.sim.reask_schedule``, ``drain_log``, ``gpu_scale_summary``).
Where it acts on files, its fs-tier pruning must remove only what no later re-ask reads."""

from __future__ import annotations

import os

import pytest

from kvscope.sim import drain_log, gpu_scale_summary, reask_schedule


def test_pruning_the_fs_tier_removes_only_block_files_older_than_the_ask(tmp_path):
    # gpu_scale --prune-fs: after re-asking prompt k, the fs files written before prompt k+1
    # was asked go (prompt k and older); prompt k+1's, and anything not a block, stay
    base = tmp_path / "model_abc_r0"
    old = [base / "0ab" / "cd_g0" / "0abcd1.bin", base / "f00" / "12_g1" / "f0012.bin"]
    new = [base / "0ab" / "cd_g0" / "0abcd2.bin", base / "777" / "77_g0" / "77777.bin"]
    config = tmp_path / "model_abc" / "config.json"
    for f in (*old, *new, config):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"kv")
    asked_at = 1_000_000.0
    for f in (*old, config):
        os.utime(f, (asked_at - 5, asked_at - 5))
    for f in new:
        os.utime(f, (asked_at + 1, asked_at + 1))
    assert reask_schedule.prune(str(tmp_path), asked_at) == 2
    assert not any(f.exists() for f in old)
    assert all(f.exists() for f in (*new, config))


def test_prefill_schedule_evicts_each_timed_prompt_with_the_next_and_never_asks_it_again():
    s = reask_schedule
    assert s.first_asks("prefill") == (0,)
    assert [s.iteration("prefill", k) for k in range(4)] == [(1, 0), (2, 1), (3, 2), (4, 3)]
    assert not s.asked_again("prefill")


def test_restore_schedule_puts_two_other_restores_between_two_asks_of_a_prompt():
    # with one other restore in between, the rows and GPU blocks to spare keep part of the
    # timed prompt (reask_schedule's docstring); two leave none
    s = reask_schedule
    history = list(s.first_asks("restore"))
    for k in range(30):
        evict, timed = s.iteration("restore", k)
        assert evict is None
        assert timed in history  # asked before: its first output is known
        assert timed not in history[-2:]
        history.append(timed)
    assert set(history) == set(s.first_asks("restore"))  # fs files of these prompts only
    assert s.asked_again("restore")


def test_an_unknown_schedule_is_refused():
    s = reask_schedule
    with pytest.raises(ValueError, match="between"):
        s.iteration("flood", 0)


def test_pruning_is_refused_for_the_schedule_that_reads_the_files_again():
    # gpu_scale --prune-fs --between restore exits here, before an engine is built
    with pytest.raises(SystemExit, match="prune"):
        reask_schedule.refuse_pruning("restore")
    reask_schedule.refuse_pruning("prefill")  # prompt k is never asked again: pruning is safe


def test_slow_restores_are_counted_per_arm_with_the_sign_test_of_their_split():
    # vLLM's slow-read regime took 12-60x the median restore on the GPU: 7 such restores in
    # on iterations and 1 in an off one is a split of probability 2 * 9/256 under equal odds
    summary = gpu_scale_summary
    iters = [{"on": k % 2 == 0, "s": 1.0} for k in range(200)]
    for k in (0, 2, 4, 6, 8, 10, 12):
        iters[k]["s"] = 20.0
    iters[1]["s"] = 25.0
    iters[3]["s"] = 3.9  # under 4x the median: the ordinary spread, not the regime
    out = summary.slow_restores(iters)
    assert (out["on"], out["off"], out["over_s"]) == (7, 1, 4.0)
    assert out["sign_test_p"] == round(2 * 9 / 256, 4)
    assert summary.sign_test(0, 0) == 1.0
    assert summary.sign_test(3, 6) == 1.0  # an even split


def test_the_pairs_without_a_slow_restore_leave_its_whole_pair_out():
    summary = gpu_scale_summary
    iters = [{"on": k % 4 in (0, 3), "s": 1.0 + k / 1000} for k in range(40)]  # ABBA
    iters[5]["s"] = 20.0  # an off restore in the slow-read regime: pair (4, 5)
    pairs = summary.without_slow(iters)
    assert len(pairs) == 19
    assert all(on["on"] and not off["on"] for on, off in pairs)
    assert not any(i is iters[4] or i is iters[5] for pair in pairs for i in pair)


def test_a_deferred_scans_cpu_leaves_the_promoting_scan_out():
    summary = gpu_scale_summary
    per_scan = summary.PAIRED_FIELDS["deferred_scan_cpu_ms"]
    it = {"reask": {"scan_cpu_s": 1.0, "scan_cpu_longest_s": 0.4, "scan_calls": 4}}
    assert per_scan(it) == pytest.approx(200.0)


def test_vllms_own_deferred_scan_and_kvscopes_tap_around_it_leave_the_promoting_scan_out():
    summary = gpu_scale_summary
    it = {"reask": {"scan_cpu_s": 1.0, "scan_cpu_longest_s": 0.4, "scan_calls": 4,
                    "vllm_scan_cpu_s": 0.91, "vllm_scan_cpu_longest_s": 0.37,
                    "vllm_scan_calls": 4}}
    assert summary.PAIRED_FIELDS["deferred_vllm_scan_cpu_ms"](it) == pytest.approx(180.0)
    # 0.6 s of tapped deferred scans against 0.54 s of vLLM's: 20 ms a scan
    assert summary.PAIRED_FIELDS["deferred_tap_cpu_us"](it) == pytest.approx(20_000.0)


def test_a_run_without_vllms_own_scan_clock_is_summarized_without_its_fields():
    summary = gpu_scale_summary
    old = {"s": 1.0, "reask": {"scan_cpu_s": 1.0, "scan_cpu_longest_s": 0.4, "scan_calls": 4}}
    names = summary.fields([old, old])
    assert "deferred_scan_cpu_ms" in names
    assert "deferred_vllm_scan_cpu_ms" not in names and "deferred_tap_cpu_us" not in names


def test_a_drain_is_in_the_reads_only_when_it_starts_inside_a_read_window():
    DrainLog = drain_log.DrainLog

    class Aggregator:
        def __init__(self):
            self.calls = 0
            self._refresh = self.refresh

        def refresh(self):
            self.calls += 1

    agg = Aggregator()
    log = DrainLog().wrap(agg)
    agg._refresh()
    assert agg.calls == 1 and len(log.spans) == 1
    log.spans[:] = [(1.0, 1.1, 0.002), (2.5, 2.6, 0.003), (3.0, 3.1, 0.004)]
    # reads in flight from 2.0 to 3.0: the drain at 2.5 is inside, the one at 3.0 is not
    assert log.split([(2.0, 3.0)]) == {"in_reads": 1, "in_reads_cpu_s": 0.003,
                                       "other": 2, "other_cpu_s": 0.006}
    assert log.split([]) == {"in_reads": 0, "in_reads_cpu_s": 0,
                             "other": 3, "other_cpu_s": 0.009}


def test_drains_in_reads_are_counted_per_arm_with_the_restores_they_fell_in():
    summary = gpu_scale_summary
    def it(on, s, n):
        return {"on": on, "s": s, "reask": {"drains": {"in_reads": n,
                                                       "in_reads_cpu_s": 0.002 * n}}}
    iters = [it(True, 1.6, 1), it(False, 1.5, 0), it(False, 1.5, 0), it(True, 1.5, 0)]
    out = summary.drains_in_reads([i for i in iters if i["on"]])
    assert out["reasks_with"] == 1 and out["of"] == 2
    assert out["cpu_s"] == pytest.approx(0.002)
    assert out["median_restore_s"] == {"with": 1.6, "without": 1.5}
