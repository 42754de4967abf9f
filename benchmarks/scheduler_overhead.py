"""Scheduler step time: ObservedOffloadingConnector vs the stock OffloadingConnector.

    python benchmarks/scheduler_overhead.py [--requests 1000] [--rounds 3] [--no-tiering]
    python benchmarks/scheduler_overhead.py --profile F [--profile-connector NAME]

Runs the same workload on vLLM's real Scheduler on CPU (kvscope.sim.cpu_engine)
with each connector, two engines in lockstep (step by step, alternating which goes
first), and compares the thread CPU time spent inside Scheduler.schedule() +
Scheduler.update_from_output() (every connector call of the scheduler side happens
there). The ratio reported is the median over rounds of each pair's ratio. ``--profile F`` cProfiles only those two calls
(the engine thread's scheduler step; the CPU harness's fake forward pass is left
out) into F and writes the top entries as text to F.txt. Results:
benchmarks/results/scheduler_overhead_*.jsonl and scheduler_profile_*.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


STOCK, OBSERVED = "OffloadingConnector", "ObservedOffloadingConnector"


def _engine(connector: str, tiering: bool):
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

    return CPUEngine(EngineConfig(rows=512, tiering=tiering, world_size=1, kv_groups=1,
                                  num_gpu_blocks=512, max_num_batched_tokens=512,
                                  max_num_seqs=32, connector=connector, step_time_s=0.0))


def _add_requests(e, n_requests: int) -> list[str]:
    from kvscope.sim.cpu_engine import prompt

    shared = prompt(0, 64)  # a shared prefix, so lookups find something
    return [e.add_request(shared + prompt(i, 32), 8) for i in range(n_requests)]


def _result(connector: str, e, wall: float) -> dict:
    return {"connector": connector, "steps": e.steps, "scheduler_s": e.scheduler_seconds,
            "wall_s": wall, "per_step_us": 1e6 * e.scheduler_seconds / e.steps}


def run_pair(n_requests: int, tiering: bool) -> list[dict]:
    """One stock and one observed engine in lockstep: step by step, alternating which
    goes first, so both see the same machine (load, clock, caches) at each moment:
    on a shared box, drift between whole runs is larger than the effect measured."""
    with _engine(STOCK, tiering) as stock, _engine(OBSERVED, tiering) as observed:
        engines = [(stock, _add_requests(stock, n_requests)),
                   (observed, _add_requests(observed, n_requests))]
        walls = [0.0, 0.0]
        step = 0
        while any(r not in e.finished for e, rids in engines for r in rids):
            order = (0, 1) if step % 2 == 0 else (1, 0)
            for i in order:
                e, rids = engines[i]
                if any(r not in e.finished for r in rids):
                    t0 = time.perf_counter()
                    e.step()
                    walls[i] += time.perf_counter() - t0
            step += 1
            if step > 100_000:
                raise TimeoutError("requests not done after 100000 steps")
        for e, _ in engines:
            e.refresh()
        return [_result(STOCK, stock, walls[0]), _result(OBSERVED, observed, walls[1])]


def run(connector: str, n_requests: int, tiering: bool, profile: str | None = None) -> dict:
    with _engine(connector, tiering) as e:
        rids = _add_requests(e, n_requests)
        if profile:
            _profile_scheduler_calls(e.scheduler, profile)
        t0 = time.perf_counter()
        e.run_until_done(rids, max_steps=100_000)
        wall = time.perf_counter() - t0
        if profile:
            _write_profile(e.scheduler, profile)
        return _result(connector, e, wall)


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


def _profile_scheduler_calls(scheduler, path: str) -> None:
    """Profile inside Scheduler.schedule / update_from_output only (what the ratio times)."""
    import cProfile

    prof = scheduler._bench_profile = cProfile.Profile()
    for name in ("schedule", "update_from_output"):
        inner = getattr(scheduler, name)

        def profiled(*a, _inner=inner, **kw):
            prof.enable()
            try:
                return _inner(*a, **kw)
            finally:
                prof.disable()

        setattr(scheduler, name, profiled)


def _write_profile(scheduler, path: str) -> None:
    import io
    import pstats

    prof = scheduler._bench_profile
    prof.dump_stats(path)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(
        "observed|scheduler_side|recorder|coverage|compat|offloading|lookup_rounds|"
        "round_verdicts|tier_taps|integrity|request_states|step_gauges", 40)
    with open(path + ".txt", "w") as f:
        f.write(out.getvalue())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-tiering", action="store_true")
    p.add_argument("--profile", help="cProfile one run's scheduler calls into this file (+ .txt)")
    p.add_argument("--coverage-cost", action="store_true",
                   help="observed runs only: thread CPU time spent judging restore coverage")
    p.add_argument("--profile-connector", default="ObservedOffloadingConnector",
                   choices=["ObservedOffloadingConnector", "OffloadingConnector"])
    args = p.parse_args()
    if args.coverage_cost:
        coverage_cost(args.requests, not args.no_tiering, args.rounds)
        return
    if args.profile:
        print(json.dumps(run(args.profile_connector, args.requests,
                             not args.no_tiering, args.profile)))
        return
    runs: dict[str, list[dict]] = {STOCK: [], OBSERVED: []}
    ratios = []
    for _ in range(args.rounds):
        pair = run_pair(args.requests, not args.no_tiering)
        for r in pair:
            runs[r["connector"]].append(r)
            print(json.dumps(r), flush=True)
        ratios.append(pair[1]["scheduler_s"] / pair[0]["scheduler_s"])
    med = {n: statistics.median(r["scheduler_s"] for r in rs) for n, rs in runs.items()}
    print(json.dumps({
        "requests": args.requests, "tiering": not args.no_tiering, "rounds": args.rounds,
        "scheduler_s_median": med,
        "pair_ratios": [round(x, 4) for x in ratios],
        "step_time_ratio_observed_over_stock": round(statistics.median(ratios), 4)}))


if __name__ == "__main__":
    main()
