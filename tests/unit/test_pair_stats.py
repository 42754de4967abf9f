"""The within-process A/B's statistics (``kvscope.sim.pair_stats``), on iterations made
here with a known arm effect: the GPU overhead verdicts rest on them.

The synthetic host switches between two speeds in stretches, as the H200 machine does
(docs/measured-facts.md, the host's two speeds); an iteration's time is CPU work that
scales with the host's speed plus GPU time that does not, and kvscope's arm adds a fixed
share of CPU work. The covariate is vLLM CPU work kvscope never runs in, measured with
noise.
"""

from __future__ import annotations

import math
import random

import pytest

from kvscope.sim import pair_stats

COST = 0.006  # the on arm's extra CPU work, a share of the CPU part


@pytest.fixture(scope="module")
def ps():
    return pair_stats


def iterations(pairs: int, seed: int, covariate_cost: float = 0.0,
               scheduler_cost: float = 0.0) -> list[dict]:
    """ABBA pairs of iterations. ``covariate_cost``: a share by which the on arm also slows
    the covariate's code (the adjustment's premise broken); ``scheduler_cost``: the same
    for the scheduler's own code (outside the connector's calls)."""
    rng = random.Random(seed)
    speed, out = 1.0, []
    for j in range(pairs):
        for on in ((True, False) if j % 2 == 0 else (False, True)):
            if rng.random() < 0.15:  # the host changes speed now and then, mid-pair too
                speed = 1.0 if speed > 1.2 else 1.7
            jitter = math.exp(rng.gauss(0, 0.01))
            cpu = 1.2 * speed * jitter * (1 + COST * on)
            gpu = 0.4 * math.exp(rng.gauss(0, 0.005))
            cov = 0.04 * speed * jitter * (1 + covariate_cost * on) * math.exp(rng.gauss(0, 0.01))
            sched = 0.3 * speed * jitter * (1 + scheduler_cost * on)
            out.append({"on": on, "s": cpu + gpu, "output_cpu_s": cov,
                        "vllm_cpu_s": cov * 3, "scheduler_cpu_s": sched + 0.1 * speed * on,
                        "sched_connector_cpu_s": 0.1 * speed * on})
    return out


def expected_ratio() -> float:
    # at speed v: (1.2 v + 0.4) / (1.2 v (1 + COST) + 0.4); the estimator is a geometric
    # mean over pairs, so take it over the two speeds (the host spends about half its
    # time at each)
    logs = [math.log((1.2 * v + 0.4) / (1.2 * v * (1 + COST) + 0.4)) for v in (1.0, 1.7)]
    return math.exp(sum(logs) / 2)


def test_the_adjustment_recovers_a_known_effect_that_the_raw_ratio_cannot_resolve(ps):
    its = iterations(200, seed=1)
    raw = ps.interval(ps.pair_logs(its))
    adj = ps.adjusted(ps.pairs_of(its))
    want = expected_ratio()
    lo, hi = adj["t_95ci"]
    assert lo <= want <= hi, (adj, want)
    assert hi < 1.0, adj  # a 0.5 % cost resolved: the interval excludes no cost
    assert hi - lo < 0.006, adj
    raw_lo, raw_hi = raw["t_95ci"]
    assert raw_hi - raw_lo > 2 * (hi - lo), (raw, adj)  # what the covariate buys
    cov_lo, cov_hi = adj["covariate_ratio"]["t_95ci"]
    assert cov_lo <= 1.0 <= cov_hi  # the premise holds here, and is reported as holding


def test_a_covariate_slowed_by_the_arm_hides_cost_and_shows_in_its_own_ratio(ps):
    """kvscope slowing the covariate's own code by as much as the CPU work it adds:
    the adjusted ratio then absorbs the cost (near 1), and the covariate's own on/off,
    reported beside it, moves away from 1 by that share."""
    # the same host and noise (one seed), the covariate's code slowed or not
    adj = ps.adjusted(ps.pairs_of(iterations(400, seed=2, covariate_cost=COST)))
    clean = ps.adjusted(ps.pairs_of(iterations(400, seed=2)))
    assert adj["t_95ci"][1] >= 0.999, adj  # the cost is no longer seen
    assert clean["t_95ci"][1] < 1.0, clean  # where it was
    shift = adj["covariate_ratio"]["on_over_off"] / clean["covariate_ratio"]["on_over_off"]
    assert shift == pytest.approx(1 + COST, abs=2e-4)


def test_premise_reports_the_schedulers_own_slowdown_relative_to_the_covariates(ps):
    runs = [{"iters": iterations(300, seed=3, scheduler_cost=0.01)}]
    got = ps.premise(runs)
    rel = got["scheduler_own_over_vllm_cpu_on_over_off"]
    lo, hi = rel["t_95ci"]
    assert lo <= 1.01 <= hi and lo > 1.0, rel
    assert got["pairs"] == 300
    clean = ps.premise([{"iters": iterations(300, seed=3)}])
    lo, hi = clean["scheduler_own_over_vllm_cpu_on_over_off"]["t_95ci"]
    assert lo <= 1.0 <= hi, clean


def test_a_case_stops_before_a_pair_that_could_outrun_its_deadline():
    out_of_time = pair_stats.out_of_time
    assert not out_of_time(100.0, None, [5.0])  # no deadline
    assert not out_of_time(100.0, 110.0, [])  # no pair timed yet: run one
    assert not out_of_time(100.0, 121.0, [5.0, 5.5])  # 21 s left >= 2 x 5.5 + 10
    assert out_of_time(100.0, 120.0, [5.0, 5.5])  # 20 s left < 21


def test_hodges_lehmann_keeps_its_estimate_through_one_pathological_pair(ps):
    # a recorded GPU restore run: 71 ordinary pairs and one 25-s on-iteration (a pair log of ~-2.8)
    rng = random.Random(11)
    logs = [0.01 + rng.gauss(0, 0.1) for _ in range(71)]
    clean = ps.hodges_lehmann(logs)
    hl = ps.hodges_lehmann([*logs, -2.8])
    mean = ps.interval([*logs, -2.8])
    assert abs(math.log(hl["ratio_on_over_off"]) - math.log(clean["ratio_on_over_off"])) < 0.01
    assert math.log(mean["ratio_on_over_off"]) < math.log(clean["ratio_on_over_off"]) - 0.03
    lo, hi = hl["signed_rank_95ci"]
    assert lo < hl["ratio_on_over_off"] < hi


def test_hodges_lehmann_interval_covers_the_centre_about_95_percent_of_the_time(ps):
    rng = random.Random(5)
    centre, covered, trials = 0.02, 0, 400
    for _ in range(trials):
        # a symmetric, heavy-tailed spread (the signed-rank test's assumption is symmetry)
        logs = [centre + rng.gauss(0, 0.05) * (4 if rng.random() < 0.1 else 1)
                for _ in range(40)]
        lo, hi = ps.hodges_lehmann(logs)["signed_rank_95ci"]
        covered += math.log(lo) <= centre <= math.log(hi)
    assert 0.92 <= covered / trials <= 0.985, covered


def test_hodges_lehmann_interval_ranks_match_the_exact_signed_rank_test_at_20_pairs(ps):
    # the exact null distribution of the signed-rank statistic for n = 20: the interval's
    # lower end is the C-th smallest Walsh average, C = the largest c with
    # P(T <= c - 1) <= 0.025; the normal approximation may be one rank wider, never narrower
    n = 20
    ways = [1] + [0] * (n * (n + 1) // 2)
    for r in range(1, n + 1):
        for t in range(len(ways) - 1, r - 1, -1):
            ways[t] += ways[t - r]
    total, cdf, exact_c = 2 ** n, 0, 0
    for c in range(len(ways)):
        cdf += ways[c]
        if cdf / total > 0.025:
            exact_c = c  # P(T <= c - 1) <= 0.025 < P(T <= c)
            break
    rng = random.Random(3)
    logs = [rng.uniform(-0.5, 0.5) for _ in range(n)]  # Walsh averages ~0.005 apart
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n))
    lo, hi = ps.hodges_lehmann(logs)["signed_rank_95ci"]
    at = lambda k: round(math.exp(walsh[k]), 4)  # noqa: E731 - as the result is rounded
    assert lo in {at(exact_c - 1), at(exact_c - 2)}, (lo, at(exact_c - 1))
    assert hi in {at(-exact_c), at(-exact_c + 1)}, (hi, at(-exact_c))
    assert at(exact_c - 1) != at(exact_c + 1)  # the ranks are told apart at this rounding


def test_pairs_split_by_their_tag_stay_whole_and_the_parts_ratios_compare(ps):
    # gpu_scale --hold-modes reads,none: blocks of two ABBA pairs alternate the mode; the
    # on arm costs 2 % more under "reads" here, nothing under "none"
    rng = random.Random(8)
    its = []
    for j in range(120):
        mode = ("reads", "none")[j // 2 % 2]
        for on in ((True, False) if j % 2 == 0 else (False, True)):
            cost = 1.02 if on and mode == "reads" else 1.0
            its.append({"on": on, "hold": mode, "s": 1.5 * cost * math.exp(rng.gauss(0, 0.015))})
    parts = ps.by_tag(its, "hold")
    assert sorted(parts) == ["none", "reads"]
    assert all(len(p) == 120 for p in parts.values())
    for p in parts.values():  # each part pairs one on with one off, as the whole run does
        assert all(on["on"] and not off["on"] for on, off in ps.pairs_of(p))
    diff = ps.ratio_between(ps.pair_logs(parts["reads"]), ps.pair_logs(parts["none"]))
    lo, hi = diff["t_95ci"]
    assert lo <= 1.02 <= hi and lo > 1.0, diff
    same = ps.ratio_between(ps.pair_logs(parts["none"][:60]), ps.pair_logs(parts["none"][60:]))
    assert same["t_95ci"][0] <= 1.0 <= same["t_95ci"][1], same
    with pytest.raises(AssertionError):
        ps.by_tag([{"on": True, "hold": "reads", "s": 1}, {"on": False, "hold": "none", "s": 1}],
                  "hold")



def test_by_hold_summarizes_each_mode_with_enough_pairs_and_compares_reads_with_none(ps):
    # gpu_scale and restore_convoy share it: a run of one mode has no by_hold; a mode with
    # fewer than min_pairs pairs gets no summary, yet both modes' pairs are compared
    def pair(mode, s_on, s_off):
        return [{"on": True, "hold": mode, "s": s_on}, {"on": False, "hold": mode, "s": s_off}]

    reads = pair("reads", 1.02, 1.0) + pair("reads", 1.03, 1.0) + pair("reads", 1.01, 1.0)
    none = pair("none", 1.0, 1.0) + pair("none", 1.01, 1.0)
    assert ps.by_hold(reads, lambda p: {"pairs": len(p) // 2}) == {}
    out = ps.by_hold(reads + none, lambda p: {"pairs": len(p) // 2}, min_pairs=3)
    assert out["by_hold"] == {"reads": {"pairs": 3}}
    assert out["hold_none_over_reads"] == ps.ratio_between(ps.pair_logs(reads),
                                                           ps.pair_logs(none))
    assert out["hold_none_over_reads"]["b_over_a"] > 1.0  # reads' on arm is the slower
    assert [ps.block_mode(("reads", "none"), k, 1) for k in range(10)] == (
        ["reads"] * 5 + ["none"] * 4 + ["reads"])
