"""Scheduler step time: ObservedOffloadingConnector vs the stock OffloadingConnector.

    python benchmarks/scheduler_overhead.py [--requests 1000] [--rounds 3] [--no-tiering]
        [--flush-interval S]
    python benchmarks/scheduler_overhead.py --profile F [--profile-connector NAME]
    python benchmarks/scheduler_overhead.py --profile-aggregator F [--no-tiering]

Runs the same workload on vLLM's real Scheduler on CPU (kvscope.sim.cpu_engine)
with each connector, two engines in lockstep (step by step, alternating which goes
first), and compares the thread CPU time spent inside Scheduler.schedule() +
Scheduler.update_from_output() (every connector call of the scheduler side happens
there). The ratio reported is the median over rounds of each pair's ratio. kvscope
aggregates on its own thread (connector/aggregator.py), whose CPU time the ratio does
not see: ``cpu_ratio_with_kvscope_threads`` adds it back (its threads' per-thread
clocks, plus the last synchronous refresh after the run). ``--profile F`` cProfiles only those two calls
(the engine thread's scheduler step; the CPU harness's fake forward pass is left
out) into F and writes the top entries as text to F.txt; ``--profile-aggregator F`` does the
same for the refreshes kvscope's aggregator thread runs (one observed engine alone: its
caches are warmer than in a lockstep pair, so the times are lower). Results:
benchmarks/results/scheduler_overhead_*.jsonl and scheduler_profile_*.txt.
``--flush-interval S`` sets the observed engine's ``flush_interval_s`` (kvscope's cadence:
aggregator thread and rank tally; default: kvscope's own); the last JSON line names it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


from kvscope.sim.lockstep import (
    OBSERVED,
    STOCK,
    add_requests,
    engine,
    final_refresh,
    kvscope_threads_cpu,
    lockstep,
    profile_aggregator_thread,
    profile_scheduler_calls,
    workload_args,
    write_profile,
    write_stats,
)


def _result(connector: str, e, wall: float, kvscope_threads_s: float = 0.0,
            final_refresh_s: float = 0.0) -> dict:
    """``kvscope_threads_s``: CPU time of kvscope's own threads (aggregator, tier probe)
    over the run; ``final_refresh_s``: the last synchronous refresh after the run (the
    journal's tail), on the engine thread but outside the timed scheduler calls."""
    return {"connector": connector, "steps": e.steps, "scheduler_s": e.scheduler_seconds,
            "wall_s": wall, "per_step_us": 1e6 * e.scheduler_seconds / e.steps,
            "kvscope_threads_s": kvscope_threads_s, "final_refresh_s": final_refresh_s}


def run_pair(n_requests: int, tiering: bool, flush_interval_s: float | None = None,
             per_key_lookups: bool = False) -> list[dict]:
    """One stock and one observed engine in lockstep: step by step, alternating which
    goes first, so both see the same machine (load, clock, caches) at each moment:
    on a shared box, drift between whole runs is larger than the effect measured."""
    with engine(STOCK, tiering) as stock, \
            engine(OBSERVED, tiering, flush_interval_s, per_key_lookups) as observed:
        walls = lockstep([(stock, add_requests(stock, n_requests)),
                          (observed, add_requests(observed, n_requests))])
        threads_s = kvscope_threads_cpu(observed)
        stock.refresh()
        return [_result(STOCK, stock, walls[0]),
                _result(OBSERVED, observed, walls[1], threads_s, final_refresh(observed))]


def run(connector: str, n_requests: int, tiering: bool, profile: str | None = None,
        profile_aggregator: str | None = None, flush_interval_s: float | None = None,
        per_key_lookups: bool = False) -> dict:
    with engine(connector, tiering, flush_interval_s, per_key_lookups) as e:
        rids = add_requests(e, n_requests)
        if profile:
            profile_scheduler_calls(e.scheduler, profile)
        if profile_aggregator:
            prof = profile_aggregator_thread(e)
        t0 = time.perf_counter()
        e.run_until_done(rids, max_steps=100_000)
        wall = time.perf_counter() - t0
        if profile:
            write_profile(e.scheduler, profile)
        if profile_aggregator:
            write_stats(prof, profile_aggregator, "scheduler_side|aggregator|round_verdicts|"
                         "coverage|request_states|step_gauges|recorder|lookup_rounds|observed|"
                         "store_refusals|tier_taps|vllm_stats|round_spans")
        return _result(connector, e, wall, kvscope_threads_cpu(e))


def coverage_cost(n_requests: int, tiering: bool, rounds: int) -> None:
    """Time RoundVerdicts._coverage (once per ended lookup round) inside observed runs."""
    from kvscope.connector import round_verdicts as rv

    judge, spent = rv.RoundVerdicts._coverage, [0, 0.0]

    def timed(self, *a, **kw):
        t0 = time.thread_time()
        try:
            return judge(self, *a, **kw)
        finally:
            spent[0] += 1
            spent[1] += time.thread_time() - t0

    rv.RoundVerdicts._coverage = timed
    for _ in range(rounds):
        spent[:] = [0, 0.0]
        r = run("ObservedOffloadingConnector", n_requests, tiering)
        print(json.dumps({"tiering": tiering, "scheduler_s": r["scheduler_s"],
                          "coverage_calls": spent[0], "coverage_s": round(spent[1], 4),
                          "coverage_share": round(spent[1] / r["scheduler_s"], 4),
                          "us_per_call": round(1e6 * spent[1] / max(spent[0], 1), 1)}),
              flush=True)


def _effective_interval(flush_interval_s: float | None) -> float:
    from kvscope.connector.aggregator import INTERVAL_S

    return INTERVAL_S if flush_interval_s is None else flush_interval_s


def main() -> None:
    p = workload_args(argparse.ArgumentParser())
    p.add_argument("--profile", help="cProfile one run's scheduler calls into this file (+ .txt)")
    p.add_argument("--coverage-cost", action="store_true",
                   help="observed runs only: thread CPU time spent judging restore coverage")
    p.add_argument("--profile-aggregator",
                   help="cProfile the observed engine's aggregator thread into this file (+ .txt)")
    p.add_argument("--profile-connector", default="ObservedOffloadingConnector",
                   choices=["ObservedOffloadingConnector", "OffloadingConnector"])
    p.add_argument("--flush-interval", type=float, default=None, metavar="S",
                   help="the observed engine's flush_interval_s (default: kvscope's)")
    p.add_argument("--per-key-lookups", action="store_true",
                   help="the observed engine records each key looked up (kvscope's setting "
                        "per_key_lookups), also where the prefix scan tells the lookups")
    args = p.parse_args()
    if args.coverage_cost:
        coverage_cost(args.requests, not args.no_tiering, args.rounds)
        return
    if args.profile or args.profile_aggregator:
        print(json.dumps(run(args.profile_connector if args.profile else OBSERVED,
                             args.requests, not args.no_tiering, args.profile,
                             args.profile_aggregator, args.flush_interval,
                             args.per_key_lookups)))
        return
    runs: dict[str, list[dict]] = {STOCK: [], OBSERVED: []}
    ratios, cpu_ratios = [], []
    for _ in range(args.rounds):
        pair = run_pair(args.requests, not args.no_tiering, args.flush_interval,
                        args.per_key_lookups)
        for r in pair:
            runs[r["connector"]].append(r)
            print(json.dumps(r), flush=True)
        stock_s, obs = pair[0]["scheduler_s"], pair[1]
        ratios.append(obs["scheduler_s"] / stock_s)
        # Honest total: kvscope's work moved off the engine thread counted back in
        cpu_ratios.append((obs["scheduler_s"] + obs["kvscope_threads_s"]
                           + obs["final_refresh_s"]) / stock_s)
    med = {n: statistics.median(r["scheduler_s"] for r in rs) for n, rs in runs.items()}
    print(json.dumps({
        "requests": args.requests, "tiering": not args.no_tiering, "rounds": args.rounds,
        "per_key_lookups": args.per_key_lookups,
        "flush_interval_s": _effective_interval(args.flush_interval),
        "scheduler_s_median": med,
        "kvscope_threads_s_median": statistics.median(
            r["kvscope_threads_s"] + r["final_refresh_s"] for r in runs[OBSERVED]),
        "pair_ratios": [round(x, 4) for x in ratios],
        "cpu_ratio_with_kvscope_threads": round(statistics.median(cpu_ratios), 4),
        "step_time_ratio_observed_over_stock": round(statistics.median(ratios), 4)}))


if __name__ == "__main__":
    main()
