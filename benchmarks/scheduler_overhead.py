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
from collections.abc import Callable

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


STOCK, OBSERVED = "OffloadingConnector", "ObservedOffloadingConnector"


def _engine(connector: str, tiering: bool, flush_interval_s: float | None = None,
            per_key_lookups: bool = False):
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

    options = {} if flush_interval_s is None else {"flush_interval_s": flush_interval_s}
    if per_key_lookups:
        options["per_key_lookups"] = True
    return CPUEngine(EngineConfig(rows=512, tiering=tiering, world_size=1, kv_groups=1,
                                  num_gpu_blocks=512, max_num_batched_tokens=512,
                                  max_num_seqs=32, connector=connector, step_time_s=0.0,
                                  kvscope_options=options))


def _add_requests(e, n_requests: int) -> list[str]:
    from kvscope.sim.cpu_engine import prompt

    shared = prompt(0, 64)  # a shared prefix, so lookups find something
    return [e.add_request(shared + prompt(i, 32), 8) for i in range(n_requests)]


def _result(connector: str, e, wall: float, kvscope_threads_s: float = 0.0,
            final_refresh_s: float = 0.0) -> dict:
    """``kvscope_threads_s``: CPU time of kvscope's own threads (aggregator, tier probe)
    over the run; ``final_refresh_s``: the last synchronous refresh after the run (the
    journal's tail), on the engine thread but outside the timed scheduler calls."""
    return {"connector": connector, "steps": e.steps, "scheduler_s": e.scheduler_seconds,
            "wall_s": wall, "per_step_us": 1e6 * e.scheduler_seconds / e.steps,
            "kvscope_threads_s": kvscope_threads_s, "final_refresh_s": final_refresh_s}


def _kvscope_threads_cpu(e) -> float:
    """CPU seconds so far of the observed engine's kvscope threads (per-thread clocks)."""
    observer = getattr(e.connector, "_kvscope_observer", None)
    if observer is None:
        return 0.0
    total = 0.0
    agg = getattr(observer, "agg", None)  # None: a kvscope before the aggregator thread
    for thread in (agg and agg.thread, getattr(observer.probe, "_thread", None)):
        if thread is not None and thread.is_alive():
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return total


def _final_refresh(e) -> float:
    t0 = time.thread_time()
    e.refresh()
    return time.thread_time() - t0


def lockstep(todo: list, clock: Callable[[], float] = time.perf_counter,
             after_step: Callable[[int], None] | None = None,
             busy: Callable[[int], bool] | None = None) -> list[float]:
    """Step engines in turn until each one's requests are done, rotating which goes first
    (step k starts with engine k mod n), so all see the same machine at each moment: on a
    shared box, drift between whole runs is larger than the effects measured. ``todo``:
    (engine, request ids) pairs; returns each engine's ``clock`` time inside ``step()``;
    ``after_step(i)`` runs after engine i's step, outside the timing; ``busy(i)``, if
    given, says instead whether engine i needs another step (a drain: stores pending)."""
    if busy is None:
        def busy(i: int) -> bool:
            e, rids = todo[i]
            return any(r not in e.finished for r in rids)
    spent = [0.0] * len(todo)
    n, step = len(todo), 0
    while any(busy(i) for i in range(n)):
        for i in [*range(step % n, n), *range(step % n)]:
            e, rids = todo[i]
            if busy(i):
                t0 = clock()
                e.step()
                spent[i] += clock() - t0
                if after_step is not None:
                    after_step(i)
        step += 1
        if step > 100_000:
            raise TimeoutError("requests not done after 100000 steps")
    return spent


def run_pair(n_requests: int, tiering: bool, flush_interval_s: float | None = None,
             per_key_lookups: bool = False) -> list[dict]:
    """One stock and one observed engine in lockstep: step by step, alternating which
    goes first, so both see the same machine (load, clock, caches) at each moment:
    on a shared box, drift between whole runs is larger than the effect measured."""
    with _engine(STOCK, tiering) as stock, \
            _engine(OBSERVED, tiering, flush_interval_s, per_key_lookups) as observed:
        walls = lockstep([(stock, _add_requests(stock, n_requests)),
                          (observed, _add_requests(observed, n_requests))])
        threads_s = _kvscope_threads_cpu(observed)
        stock.refresh()
        return [_result(STOCK, stock, walls[0]),
                _result(OBSERVED, observed, walls[1], threads_s, _final_refresh(observed))]


def run(connector: str, n_requests: int, tiering: bool, profile: str | None = None,
        profile_aggregator: str | None = None, flush_interval_s: float | None = None,
        per_key_lookups: bool = False) -> dict:
    with _engine(connector, tiering, flush_interval_s, per_key_lookups) as e:
        rids = _add_requests(e, n_requests)
        if profile:
            _profile_scheduler_calls(e.scheduler, profile)
        if profile_aggregator:
            prof = _profile_aggregator(e)
        t0 = time.perf_counter()
        e.run_until_done(rids, max_steps=100_000)
        wall = time.perf_counter() - t0
        if profile:
            _write_profile(e.scheduler, profile)
        if profile_aggregator:
            _write_stats(prof, profile_aggregator, "scheduler_side|aggregator|round_verdicts|"
                         "coverage|request_states|step_gauges|recorder|lookup_rounds|observed|"
                         "store_refusals|tier_taps|vllm_stats|round_spans")
        return _result(connector, e, wall, _kvscope_threads_cpu(e))


def _profile_aggregator(e):
    """cProfile kvscope's aggregator thread: every refresh it runs (on its own thread's
    CPU clock), not the engine thread's synchronous ones."""
    import cProfile

    agg = e.connector._kvscope_observer.agg
    prof = cProfile.Profile(time.thread_time)
    inner = agg._refresh

    def profiled() -> None:
        prof.enable()
        try:
            inner()
        finally:
            prof.disable()

    agg._refresh = profiled
    return prof


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

    # The engine thread's CPU time (as the ratio): a wall-clock timer would charge the
    # function that waited for the GIL with what kvscope's aggregator thread did meanwhile.
    prof = scheduler._bench_profile = cProfile.Profile(time.thread_time)
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
    _write_stats(scheduler._bench_profile, path,
                 "observed|scheduler_side|scheduler_hooks|manager_proxy|prefix_scan|recorder|"
                 "coverage|"
                 "compat|offloading|lookup_rounds|round_verdicts|tier_taps|integrity|"
                 "request_states|step_gauges")


def _write_stats(prof, path: str, ours: str) -> None:
    import io
    import pstats

    prof.dump_stats(path)
    if not prof.getstats():  # nothing ran profiled (a run shorter than the cadence)
        with open(path + ".txt", "w") as f:
            f.write("no call profiled\n")
        return
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(ours, 40)
    stats.sort_stats("tottime").print_stats(ours, 40)  # kvscope's own time, per function
    with open(path + ".txt", "w") as f:
        f.write(out.getvalue())


def workload_args(p: argparse.ArgumentParser, rounds: int = 3) -> argparse.ArgumentParser:
    """The workload options every lockstep benchmark here shares."""
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--no-tiering", action="store_true")
    return p


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
