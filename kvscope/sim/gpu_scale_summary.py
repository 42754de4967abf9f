"""gpu_scale.py's results summarized (its ``summarize`` subcommand): per case, the on/off
restore ratio over the ABBA pairs (t, bootstrap and Hodges-Lehmann intervals), where the
on-arm's time went pair by pair, vLLM's scans and promotions per re-ask, and with several
hold modes in a run each mode's summary and how they differ.
"""

from __future__ import annotations

import json
import math
import statistics

from kvscope.sim import pair_stats
from kvscope.sim.pair_stats import hodges_lehmann, interval, pair_logs, paired_diffs, pairs_of


def summary(iters: list[dict]) -> dict:
    n = len(iters) // 2 * 2
    iters = iters[:n]
    on = [i for i in iters if i["on"]]
    off = [i for i in iters if not i["on"]]
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    dig = [sum(i["digest_wall_s"].values()) / i["s"] for i in on]
    return {**interval(pair_logs(iters)),
            "hodges_lehmann": hodges_lehmann(pair_logs(iters)),
            # where the on-arm's time went, pair by pair (fields every iteration has), and
            # the same over the pairs with no restore in the slow-read regime
            "paired": paired_diffs(pairs_of(iters), fields(iters)),
            "paired_without_slow": paired_diffs(without_slow(iters), fields(iters)),
            "median_restore_s": {"on": med([i["s"] for i in on]),
                                 "off": med([i["s"] for i in off])},
            "median_tokens_per_s": {"on": med([i["tokens_per_s"] for i in on]),
                                    "off": med([i["tokens_per_s"] for i in off])},
            "digest_share_of_restore_on": {"median": round(med(dig), 4),
                                           "max": round(max(dig), 4)},
            "kvscope_threads_cpu_s_on": med([i["threads"]["kvscope"]["cpu_s"] for i in on]),
            # vLLM's scans during the re-ask: how many, their CPU, the longest one's
            "reask_scans": {arm: {"calls": med([i["reask"]["scan_calls"] for i in xs]),
                                  "cpu_s": med([i["reask"]["scan_cpu_s"] for i in xs]),
                                  "longest_cpu_s": med([i["reask"].get("scan_cpu_longest_s", 0)
                                                        for i in xs]),
                                  "gc_s": med([i["reask"].get("gc", {}).get("s", 0)
                                               for i in xs])}
                            for arm, xs in (("on", on), ("off", off)) if "reask" in xs[0]},
            # restores in vLLM's slow-read regime (its read threads starved of the GIL), per arm
            "slow_restores": slow_restores(iters),
            # re-asks that promoted more keys than the first (a churn), and failed keys
            "reask_promotions": {arm: _promotions(xs) for arm, xs in (("on", on), ("off", off))
                                 if any("promotions" in i.get("reask", {}) for i in xs)},
            # kvscope's periodic drains inside the re-asks' read windows, per arm
            "drains_in_reads": {arm: drains_in_reads(xs) for arm, xs in (("on", on),
                                                                         ("off", off))
                                if xs and all("drains" in i.get("reask", {}) for i in xs)}}


def drains_in_reads(iters: list[dict]) -> dict:
    """Of these re-asks, how many had a kvscope drain start while their reads were in
    flight, those drains' CPU in all, and the median restore with and without one."""
    hit = [i for i in iters if i["reask"]["drains"]["in_reads"]]
    rest = [i for i in iters if not i["reask"]["drains"]["in_reads"]]
    med = lambda xs: round(statistics.median(i["s"] for i in xs), 4) if xs else None  # noqa: E731
    return {"reasks_with": len(hit), "of": len(iters),
            "cpu_s": round(sum(i["reask"]["drains"]["in_reads_cpu_s"] for i in iters), 4),
            "median_restore_s": {"with": med(hit), "without": med(rest)}}


def per_deferred_scan(seconds: float, longest: float, calls: int) -> float:
    """CPU per scan, the longest (the promoting scan) left out: a deferred scan's."""
    return (seconds - longest) / max(1, calls - 1)


def _deferred(reask: dict, clock: str) -> float:
    """A re-ask's deferred scans on one of its scan clocks ("scan", "vllm_scan"), s each."""
    return per_deferred_scan(reask[f"{clock}_cpu_s"], reask[f"{clock}_cpu_longest_s"],
                             reask[f"{clock}_calls"])


# Per iteration: the restore, vLLM's promotion job (its reads) and the rest of the re-ask,
# vLLM's scans during it (all; the longest, the promoting one), the threads' CPU
PAIRED_FIELDS = {
    "restore_s": lambda i: i["s"],
    "promotion_job_s": lambda i: i["reask"]["promotions"]["longest_job_s"],
    "restore_less_job_s": lambda i: i["s"] - i["reask"]["promotions"]["longest_job_s"],
    "scan_cpu_s": lambda i: i["reask"]["scan_cpu_s"],
    "promoting_scan_cpu_s": lambda i: i["reask"]["scan_cpu_longest_s"],
    # each of the others, the deferred scans while the restore waits: per scan, in ms (a
    # difference of tens of us survives the rounding)
    "deferred_scan_cpu_ms": lambda i: 1e3 * _deferred(i["reask"], "scan"),
    # vLLM's own deferred scans (the clock inside kvscope's tap when on): where this grows
    # with kvscope on as deferred_scan_cpu_ms does, vLLM's scan is what slowed, not the tap
    "deferred_vllm_scan_cpu_ms": lambda i: 1e3 * _deferred(i["reask"], "vllm_scan"),
    # kvscope's tap around each deferred scan, less vLLM's scan in it, in us (off: the
    # clocks' own frames, the same in both arms)
    "deferred_tap_cpu_us": lambda i: 1e6 * (_deferred(i["reask"], "scan")
                                            - _deferred(i["reask"], "vllm_scan")),
    "scans": lambda i: i["reask"]["scan_calls"],
    "lookup_call_cpu_s": lambda i: i["calls_cpu_s"]["s.get_num_new_matched_tokens"],
    "engine_cpu_s": lambda i: i["threads"]["engine"]["cpu_s"],
    "kvscope_cpu_s": lambda i: i["threads"]["kvscope"]["cpu_s"],
    "kvscope_cpu_in_reask_s": lambda i: i["reask"]["threads"]["kvscope"]["cpu_s"],
    "other_threads_cpu_s": lambda i: i["threads"]["other"]["cpu_s"],
}


def fields(iters: list[dict]) -> dict:
    """The paired fields every iteration has."""
    return {k: f for k, f in PAIRED_FIELDS.items() if all(_has(f, i) for i in iters)}


# A restore this many times the median (both arms') is in the slow-read regime: on the GPU
# they took 12-60x it (18.6-97.5 s against 1.5-7.9 s), no other restore took 2x
SLOW_FACTOR = 4.0


def slow_limit(iters: list[dict], factor: float = SLOW_FACTOR) -> float:
    """The restore time over which a restore is in the slow-read regime."""
    return factor * statistics.median(i["s"] for i in iters)


def without_slow(iters: list[dict], factor: float = SLOW_FACTOR) -> list[tuple[dict, dict]]:
    """The (on, off) pairs neither of whose restores is in the slow-read regime
    (:func:`slow_limit`): what the other restores' parts cost, one 15-s restore left out
    of their means."""
    limit = slow_limit(iters, factor)
    return [p for p in pairs_of(iters) if all(i["s"] <= limit for i in p)]


def slow_restores(iters: list[dict], factor: float = SLOW_FACTOR) -> dict:
    """How many restores of each arm took over ``factor`` times the median one, and the
    exact two-sided sign test of their split (equal odds in both arms, as many iterations
    of each: ABBA): whether kvscope makes vLLM's slow-read regime likelier."""
    limit = slow_limit(iters, factor)
    on = sum(1 for i in iters if i["on"] and i["s"] > limit)
    off = sum(1 for i in iters if not i["on"] and i["s"] > limit)
    return {"over_s": round(limit, 3), "on": on, "off": off,
            "sign_test_p": sign_test(on, on + off)}


def sign_test(k: int, n: int) -> float:
    """Two-sided exact binomial probability of a split at least as lopsided as k of n
    (p = 1/2); 1.0 for n = 0."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, j) for j in range(max(k, n - k), n + 1)) / 2 ** n
    return round(min(1.0, 2 * tail), 4)


def _has(field, it: dict) -> bool:
    try:
        field(it)
    except (KeyError, TypeError):
        return False
    return True


def by_hold(iters: list[dict]) -> dict:
    """Each hold mode's summary (of two pairs or more) and how they differ (pair_stats)."""
    return pair_stats.by_hold(iters, summary, min_pairs=2)


def _promotions(iters: list[dict]) -> dict:
    iters = [i for i in iters if "promotions" in i.get("reask", {})]  # runs before J: none
    keys = [i["reask"]["promotions"]["keys"] for i in iters]
    jobs = [i["reask"]["promotions"]["longest_job_s"] for i in iters]
    return {"keys_min": min(keys), "keys_max": max(keys),
            "reasks_over_min": sum(k > min(keys) for k in keys),
            "failed_keys": sum(i["reask"]["promotions"]["failed_keys"] for i in iters),
            "longest_job_s": {"median": statistics.median(jobs), "max": max(jobs)}}


def summarize_files(paths: list[str]) -> dict:
    """Per case (tokens, checksum policy and scope, the model's shape; the tiny shape is
    named only where it is not the one), the processes' pairs pooled."""
    by_case: dict[tuple[int, str, str, str], list[dict]] = {}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        # results before checksum_scope existed digested every rank ("all"); before shape
        # existed every run was the tiny model
        by_case.setdefault((r["tokens"], r.get("checksum_policy", "refuse"),
                            r.get("checksum_scope", "all"), r.get("shape", "tiny")),
                           []).append(r)
    out = {}
    for (tokens, policy, scope, shape), runs in sorted(by_case.items()):
        iters = [i for r in runs for i in r["iters"][:len(r["iters"]) // 2 * 2]]
        name = f"{tokens} {policy} {scope}" + ("" if shape == "tiny" else f" {shape}")
        out[name] = {"processes": len(runs), **summary(iters), **by_hold(iters),
                     "checks": [r.get("checks") for r in runs]}
    return out
