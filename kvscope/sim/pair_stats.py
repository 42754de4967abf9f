"""The within-process A/B's statistics: pairs of iterations (one on, one off), their
ratio with t and bootstrap intervals, the ratio adjusted for the host's speed, and where
an arm's extra time went.

The host's speed is the largest noise: on the H200 machine (a KVM guest, one thread per
core, no cpufreq exposed) the same pure-Python loop takes ~11-13 ms or ~20-25 ms at
different times, and an iteration's time moves with it by 10-50 % when a pair straddles
a switch. It is controlled with a covariate measured inside each iteration: the engine
thread's CPU time in vLLM code kvscope never runs in (output processing; the model
runner's input preparation) for the same work in both arms, so it tracks the host's
speed and not the arm. The adjusted ratio is the intercept of the pair log ratios
regressed on the covariate's pair log ratios; it is valid while the covariate's own
on/off ratio is 1 within its interval (reported next to it, so a reader can check).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable

from kvscope.sim import gpu_workload as gsb


def abba(warmup: int, pairs: int) -> list[bool]:
    """The arms in order (True: on): ``warmup`` alternating, then ABBA pairs (on-off, off-on,
    ...), so a drift of the host's speed falls on both arms alike."""
    order = [k % 2 == 0 for k in range(warmup)]
    for j in range(pairs):
        order += [True, False] if j % 2 == 0 else [False, True]
    return order


def block_mode(modes: tuple[str, ...], k: int, warmup: int) -> str:
    """The mode of iteration ``k`` of :func:`abba`'s order where ``modes`` alternate by blocks
    of two ABBA pairs (the warm-up runs the first): each block is balanced on/off, and a
    pair never straddles two modes (:func:`by_tag` asserts it)."""
    return modes[max(0, k - warmup) // 4 % len(modes)]


def pair_logs(iters: list[dict]) -> list[float]:
    """log(t_off / t_on) per pair: log of tokens/s(on) / tokens/s(off)."""
    out = []
    for a, b in zip(iters[0::2], iters[1::2], strict=True):
        on, off = (a, b) if a["on"] else (b, a)
        assert on["on"] and not off["on"], "a pair holds one iteration of each state"
        out.append(math.log(off["s"] / on["s"]))
    return out


def interval(logs: list[float], seed: int = 0) -> dict:
    n = len(logs)
    mean = statistics.mean(logs)
    out = {"pairs": n, "ratio_on_over_off": round(math.exp(mean), 4)}
    if n >= 2:
        half = gsb.t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
        rng = random.Random(seed)
        boots = sorted(statistics.mean(rng.choices(logs, k=n)) for _ in range(10000))
        out.update(t_95ci=[round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)],
                   bootstrap_95ci=[round(math.exp(boots[249]), 4),
                                   round(math.exp(boots[9749]), 4)],
                   pair_log_sd=round(statistics.stdev(logs), 4))
    return out


def hodges_lehmann(logs: list[float]) -> dict:
    """The on/off ratio as the median of the pairs' Walsh averages (robust to one slow
    pair, where the mean of logs is not), with the signed-rank test's 95 % interval
    (normal approximation of its critical rank; fine from ~20 pairs)."""
    n = len(logs)
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n))
    m = len(walsh)
    c = int(n * (n + 1) / 4 - 1.96 * math.sqrt(n * (n + 1) * (2 * n + 1) / 24))
    out = {"pairs": n, "ratio_on_over_off": round(math.exp(statistics.median(walsh)), 4)}
    if c >= 1:  # walsh[c - 1] and walsh[m - c]: the c-th smallest and largest
        out["signed_rank_95ci"] = [round(math.exp(walsh[c - 1]), 4),
                                   round(math.exp(walsh[m - c]), 4)]
    return out


def paired_diffs(pairs: list[tuple[dict, dict]], fields: dict[str, Callable[[dict], float]]
                 ) -> dict:
    """Per field: the mean on and off over the pairs, and the mean paired difference
    (on - off) with a t interval: where an arm's extra time went."""
    out = {}
    for name, f in fields.items():
        d = [f(on) - f(off) for on, off in pairs]
        if len(d) < 2:
            continue
        half = gsb.t975(len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
        m = statistics.mean(d)
        out[name] = {"on": round(statistics.mean(f(on) for on, _ in pairs), 4),
                     "off": round(statistics.mean(f(off) for _, off in pairs), 4),
                     "diff": round(m, 4), "diff_95ci": [round(m - half, 4), round(m + half, 4)]}
    return out


def by_tag(iters: list[dict], tag: str) -> dict[str, list[dict]]:
    """Iterations split by a per-pair tag (both of a pair carry the same): each part keeps
    its pairs whole and in order, so :func:`pairs_of` pairs it as the whole run."""
    out: dict[str, list[dict]] = {}
    for a, b in zip(iters[0::2], iters[1::2]):
        assert a.get(tag) == b.get(tag), "a pair's iterations carry one tag"
        out.setdefault(str(a.get(tag)), []).extend((a, b))
    return out


def by_hold(iters: list[dict], summary: Callable[[list[dict]], dict],
            min_pairs: int = 1) -> dict:
    """With more than one hold mode in a run (tag ``hold``): each mode's ``summary`` (of modes
    with ``min_pairs`` pairs or more), and how the on arm's cost differs between them (none
    over reads: > 1 when not holding back costs less)."""
    parts = by_tag(iters, "hold")
    if len(parts) < 2:
        return {}
    out: dict = {"by_hold": {m: summary(p) for m, p in parts.items()
                             if len(p) >= 2 * min_pairs}}
    if "reads" in parts and "none" in parts:
        out["hold_none_over_reads"] = ratio_between(pair_logs(parts["reads"]),
                                                    pair_logs(parts["none"]))
    return out


def ratio_between(logs_a: list[float], logs_b: list[float]) -> dict:
    """How two sets of pairs' on/off ratios differ: exp(mean b - mean a) with a Welch t
    95 % interval (b's ratio over a's; > 1: the on arm costs less under b)."""
    ma, mb = statistics.mean(logs_a), statistics.mean(logs_b)
    va, vb = statistics.variance(logs_a) / len(logs_a), statistics.variance(logs_b) / len(logs_b)
    df = (va + vb) ** 2 / (va ** 2 / (len(logs_a) - 1) + vb ** 2 / (len(logs_b) - 1))
    half = gsb.t975(int(df)) * math.sqrt(va + vb)
    return {"b_over_a": round(math.exp(mb - ma), 4),
            "t_95ci": [round(math.exp(mb - ma - half), 4), round(math.exp(mb - ma + half), 4)]}


def _field(it: dict, name: str) -> float:
    if name == "engine_blocked_s":  # wall time the engine thread neither ran nor queued
        e = it["threads"]["engine"]
        return it["s"] - e["cpu_s"] - e["runq_s"]
    if name.startswith("calls:"):  # one connector method's clock (gpu_within_process.py)
        return it["calls"][name[6:]]
    if "." in name:
        kind, what = name.split(".")
        return it["threads"][kind][what]
    return it[name]


DIAGNOSTICS = ("scheduler_cpu_s", "sched_connector_cpu_s", "worker_connector_cpu_s",
               "stat_logger_cpu_s", "output_cpu_s", "vllm_cpu_s", "sync_refresh_cpu_s", "schedules",
               "empty_schedules", "engine.cpu_s", "engine.runq_s", "engine_blocked_s",
               "kvscope.cpu_s", "other.cpu_s")


def diagnostics(iters: list[dict]) -> dict:
    """Per field: the mean on and off, and the mean paired difference (on - off) with a
    t interval: where an arm's extra wall time went."""
    if not iters or "threads" not in iters[0]:
        return {}
    per_call = tuple(f"calls:{n}" for n in iters[0].get("calls", {}))
    return paired_diffs(pairs_of(iters), {name: lambda it, n=name: _field(it, n)
                                          for name in ("s", *DIAGNOSTICS, *per_call)})


def pairs_of(iters: list[dict]) -> list[tuple[dict, dict]]:
    """(on, off) per pair of consecutive iterations."""
    return [(a, b) if a["on"] else (b, a) for a, b in zip(iters[0::2], iters[1::2])]


def adjusted(pairs: list[tuple[dict, dict]], covariate: str = "output_cpu_s") -> dict:
    """The on/off ratio adjusted for the host's speed during each pair: the intercept of
    pair log(t_off/t_on) regressed on the covariate's pair log ratio (valid while the
    covariate's own on/off ratio is 1: reported as ``covariate_ratio``)."""
    if len(pairs) < 4 or any(not on.get(covariate) or not off.get(covariate)
                             for on, off in pairs):
        return {}
    y = [math.log(off["s"] / on["s"]) for on, off in pairs]
    x = [math.log(off[covariate] / on[covariate]) for on, off in pairs]
    n, mx, my = len(y), statistics.mean(x), statistics.mean(y)
    sxx = sum((v - mx) ** 2 for v in x)
    slope = sum((u - mx) * (v - my) for u, v in zip(x, y)) / sxx
    a = my - slope * mx
    res = [v - a - slope * u for u, v in zip(x, y)]
    se = math.sqrt(sum(r * r for r in res) / (n - 2) * (1 / n + mx * mx / sxx))
    half = gsb.t975(n - 2) * se
    cx = interval([-v for v in x])  # covariate on/off, as the time ratio on/off
    return {"covariate": covariate, "ratio_on_over_off": round(math.exp(a), 4),
            "t_95ci": [round(math.exp(a - half), 4), round(math.exp(a + half), 4)],
            "slope": round(slope, 3), "residual_log_sd": round(statistics.stdev(res), 4),
            "covariate_ratio": {"on_over_off": cx["ratio_on_over_off"],
                                "t_95ci": cx.get("t_95ci")}}


def summarize_iters(iters: list[dict]) -> dict:
    on = [i["s"] for i in iters if i["on"]]
    off = [i["s"] for i in iters if not i["on"]]
    restored = {i["restored"] for i in iters}
    return {**interval(pair_logs(iters)),
            "median_s": {"on": statistics.median(on), "off": statistics.median(off)},
            "scheduler_cpu_share": round(sum(i.get("scheduler_cpu_s", 0.0) for i in iters)
                                         / sum(i["s"] for i in iters), 4),
            "restored_per_reask": sorted(restored),
            "adjusted": adjusted(pairs_of(iters)),
            "adjusted_vllm": adjusted(pairs_of(iters), "vllm_cpu_s"),
            "diagnostics": diagnostics(iters)}


def summarize(runs: list[dict]) -> dict:
    out: dict = {}
    for mode in sorted({r["mode"] for r in runs}):
        ok = [r for r in runs if r["mode"] == mode and "iters" in r]
        if not ok:
            out[mode] = {"error": "no completed process"}
            continue
        logs = [x for r in ok for x in pair_logs(r["iters"])]
        pairs = [p for r in ok for p in pairs_of(r["iters"])]
        out[mode] = {**interval(logs), "processes": len(ok),
                     "per_process": [r["summary"]["ratio_on_over_off"] for r in ok],
                     "adjusted": adjusted(pairs), "adjusted_vllm": adjusted(pairs, "vllm_cpu_s")}
    return out


def _scheduler_own(it: dict) -> float:
    """The engine thread's CPU in vLLM's scheduler calls outside the connector's
    scheduler-role calls (where kvscope's hooks run)."""
    return it["scheduler_cpu_s"] - it["sched_connector_cpu_s"]


def premise(runs: list[dict]) -> dict:
    """The adjustment's premise, over all pairs of ``runs`` (any mode): each covariate's own
    on/off ratio (1 if kvscope does not change vLLM's code it measures), and the scheduler's
    own CPU relative to the larger covariate, on/off (kvscope's hooks run between the
    scheduler's own code, not inside the covariates' calls): an effect there is a real cost
    of kvscope's that adjusting by the scheduler's own time would remove. Also the residual
    spread each candidate covariate leaves."""
    pairs = [p for r in runs if r.get("iters") and "sched_connector_cpu_s" in r["iters"][0]
             for p in pairs_of(r["iters"])]
    out: dict = {"pairs": len(pairs)}
    for c in ("output_cpu_s", "vllm_cpu_s"):
        out[c + "_on_over_off"] = interval([math.log(on[c] / off[c]) for on, off in pairs])
    out["scheduler_own_over_vllm_cpu_on_over_off"] = interval([
        math.log(_scheduler_own(on) / on["vllm_cpu_s"])
        - math.log(_scheduler_own(off) / off["vllm_cpu_s"]) for on, off in pairs])
    for on, off in pairs:
        on["scheduler_own_cpu_s"], off["scheduler_own_cpu_s"] = \
            _scheduler_own(on), _scheduler_own(off)
    out["residual_log_sd"] = {c: adjusted(pairs, c).get("residual_log_sd") for c in (
        "output_cpu_s", "vllm_cpu_s", "scheduler_own_cpu_s")}
    return out


def out_of_time(now: float, deadline: float | None, pair_s: list[float]) -> bool:
    """Whether a next pair could run past ``deadline`` (monotonic seconds): the time left
    is under twice the longest pair so far, plus the final settle and scrape. A case that
    stops here ends whole; one the parent's timeout kills keeps only its last checkpoint."""
    if deadline is None or not pair_s:
        return False
    return deadline - now < 2 * max(pair_s) + 10
