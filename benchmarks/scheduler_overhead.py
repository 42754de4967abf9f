"""Scheduler step time: ObservedOffloadingConnector vs the stock OffloadingConnector.

    python benchmarks/scheduler_overhead.py [--requests 1000] [--rounds 3]

Runs the same workload on vLLM's real Scheduler on CPU (kvscope.connector.cpu_engine)
with each connector, alternating, and compares the wall time spent inside
Scheduler.schedule() + Scheduler.update_from_output() (every connector call of
the scheduler side happens there). Results: benchmarks/results/scheduler_overhead.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def run(connector: str, n_requests: int, tiering: bool, profile: str | None = None) -> dict:
    from kvscope.connector.cpu_engine import CPUEngine, EngineConfig, prompt

    cfg = EngineConfig(rows=512, tiering=tiering, world_size=1, kv_groups=1, num_gpu_blocks=512,
                       max_num_batched_tokens=512, max_num_seqs=32, connector=connector,
                       step_time_s=0.0)
    with CPUEngine(cfg) as e:
        shared = prompt(0, 64)  # a shared prefix, so lookups find something
        rids = [e.add_request(shared + prompt(i, 32), 8) for i in range(n_requests)]
        prof = None
        if profile:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        e.run_until_done(rids, max_steps=100_000)
        wall = time.perf_counter() - t0
        if prof:
            prof.disable()
            prof.dump_stats(profile)
        return {"connector": connector, "steps": e.steps, "scheduler_s": e.scheduler_seconds,
                "wall_s": wall, "per_step_us": 1e6 * e.scheduler_seconds / e.steps}


def coverage_cost(n_requests: int, tiering: bool, rounds: int) -> None:
    """Time SchedulerObserver._coverage (once per ended lookup round) inside observed runs."""
    from kvscope.connector import scheduler_side as ss

    judge, spent = ss.SchedulerObserver._coverage, [0, 0.0]

    def timed(self, *a, **kw):
        t0 = time.thread_time()
        try:
            return judge(self, *a, **kw)
        finally:
            spent[0] += 1
            spent[1] += time.thread_time() - t0

    ss.SchedulerObserver._coverage = timed
    for _ in range(rounds):
        spent[:] = [0, 0.0]
        r = run("ObservedOffloadingConnector", n_requests, tiering)
        print(json.dumps({"tiering": tiering, "scheduler_s": r["scheduler_s"],
                          "coverage_calls": spent[0], "coverage_s": round(spent[1], 4),
                          "coverage_share": round(spent[1] / r["scheduler_s"], 4),
                          "us_per_call": round(1e6 * spent[1] / max(spent[0], 1), 1)}),
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-tiering", action="store_true")
    p.add_argument("--profile", help="cProfile the observed run into this file")
    p.add_argument("--coverage-cost", action="store_true",
                   help="observed runs only: thread CPU time spent judging restore coverage")
    args = p.parse_args()
    if args.coverage_cost:
        coverage_cost(args.requests, not args.no_tiering, args.rounds)
        return
    if args.profile:
        print(json.dumps(run("ObservedOffloadingConnector", args.requests,
                             not args.no_tiering, args.profile)))
        return
    runs: dict[str, list[dict]] = {"OffloadingConnector": [], "ObservedOffloadingConnector": []}
    for _ in range(args.rounds):
        for name in runs:
            runs[name].append(run(name, args.requests, not args.no_tiering))
            print(json.dumps(runs[name][-1]), flush=True)
    med = {n: statistics.median(r["scheduler_s"] for r in rs) for n, rs in runs.items()}
    print(json.dumps({
        "requests": args.requests, "tiering": not args.no_tiering,
        "scheduler_s_median": med,
        "step_time_ratio_observed_over_stock":
            round(med["ObservedOffloadingConnector"] / med["OffloadingConnector"], 4)}))


if __name__ == "__main__":
    main()
