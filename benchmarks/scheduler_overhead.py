"""Scheduler step time: ObservedOffloadingConnector vs the stock OffloadingConnector.

    python benchmarks/scheduler_overhead.py [--requests 1000] [--rounds 3] [--no-tiering]
        [--flush-interval S] [--no-kvscope-threads]
    python benchmarks/scheduler_overhead.py --profile F [--profile-connector NAME]
    python benchmarks/scheduler_overhead.py --profile-aggregator F [--no-tiering]
    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \\
        python benchmarks/scheduler_overhead.py --lookup-path P --callgrind [--tokens 16384] [--no-tiering]
    python benchmarks/scheduler_overhead.py --instructions [--requests 300] [--rounds 3] [--no-tiering]

Runs the same workload on vLLM's real Scheduler on CPU (kvscope.sim.cpu_engine)
with each connector, two engines in lockstep (step by step, alternating which goes
first), and compares the thread CPU time spent inside Scheduler.schedule() +
Scheduler.update_from_output() (every connector call of the scheduler side happens
there). The ratio reported is the median over rounds of each pair's ratio. kvscope
aggregates on its own thread (connector/aggregator.py), whose CPU time the ratio does
not see: ``cpu_ratio_with_kvscope_threads`` adds it back (its threads' per-thread
clocks, plus the last synchronous refresh after the run). Each pair also says what of its
ratio is Python's garbage collections (their CPU time inside each engine's timed calls, per
generation: ``gc_points_median``) and kvscope aggregating on vLLM's thread at the step that
leaves the engine idle (``refresh_in_step_points_median``). ``--profile F`` cProfiles only those two calls
(the engine thread's scheduler step; the CPU harness's fake forward pass is left
out) into F and writes the top entries as text to F.txt; ``--profile-aggregator F`` does the
same for the refreshes kvscope's aggregator thread runs (one observed engine alone: its
caches are warmer than in a lockstep pair, so the times are lower). Results:
benchmarks/results/scheduler_overhead_*.jsonl and scheduler_profile_*.txt.
``--flush-interval S`` sets the observed engine's ``flush_interval_s`` (kvscope's cadence:
aggregator thread and rank tally; default: kvscope's own); the last JSON line names it.
``--no-kvscope-threads``: kvscope's aggregator and tier probe never run beside the timed calls
(kvscope.sim.lockstep.engine): every event is applied at the idle step, and the ratio less
``refresh_in_step_points_median`` is the hooks alone, without what threads sharing the
engine's core cost its thread.

``--lookup-path P``: what each path of the lookup hot path (docs/architecture.md) costs on one
long restore, counted. One engine on vLLM's real scheduler on CPU (kvscope.sim.scale_workload): a ``--tokens`` prompt
asked, flooded out of the GPU blocks (and, with tiering, out of the primary tier), asked
again. Counted over the re-ask only (its scheduler calls: ``Scheduler.schedule`` +
``update_from_output``): with tiering, a restore from the fs tier whose promotions are held
``--delay`` steps, so its lookup round is deferred and re-scans the whole prompt every step
(the case the scan taps exist for); ``--no-tiering``, a restore from the CPU tier alone, one
scan. ``--path``: ``stock`` (vLLM's OffloadingConnector), ``per_key`` (1: the per-key tap,
``per_key_lookups``), ``scan`` (the default without a secondary tier: 2, the scan tap),
``tiered`` (3 alone: no deferred-scan cache, no bare rest), ``tiered_cache`` (3 and 4),
``tiered_all`` (3, 4 and 5: the default with tiering).

Deterministic counts (the host's load does not move them): the Python calls and bytecodes
the scheduler thread ran in those calls (``sys.setprofile`` / ``sys.settrace``, slow), or,
with ``--callgrind`` under valgrind, its machine instructions (callgrind's client requests,
through a small library compiled here with ``cc``: valgrind's headers needed). Also the
prefix scans vLLM ran and the keys they looked up (where kvscope leaves the scan untapped:
stock and per_key), and what the re-ask restored. One JSON line.

``--instructions``: the step ratio counted instead of timed, so a noisy machine cannot move
it. Each connector's engine runs the timed workload alone under valgrind's callgrind
(``--requests``; a subprocess each); instructions are collected only inside the scheduler's
two calls, kvscope's aggregator thread is kept idle (``flush_interval_s`` an hour) and its
journal applied between steps, outside the count (what it costs is its own thread's, not
the step's). No stats object is handed to vLLM: kvscope hands one per flush interval (1 s,
hundreds of steps), not per step. Python's string hashing is seeded per run (both engines
of run i with PYTHONHASHSEED=i+1): with a random seed per process a count moved by ~0.5 %
(dict layouts, garbage collections falling in or out of the counted calls), with one seed
two counts of an engine agree to ~0.01 %. Each of ``--rounds`` runs counts both engines
(alternating which goes first); a JSON line per run, then the median of their ratios.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
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


def _result(connector: str, e, wall: float, parts: dict, kvscope_threads_s: float = 0.0,
            final_refresh_s: float = 0.0) -> dict:
    """``kvscope_threads_s``: CPU time of kvscope's own threads (aggregator, tier probe)
    over the run; ``final_refresh_s``: the last synchronous refresh after the run (the
    journal's tail), on the engine thread but outside the timed scheduler calls; ``parts``:
    what :class:`_Parts` saw inside this engine's timed calls."""
    return {"connector": connector, "steps": e.steps, "scheduler_s": e.scheduler_seconds,
            "wall_s": wall, "per_step_us": 1e6 * e.scheduler_seconds / e.steps,
            "kvscope_threads_s": kvscope_threads_s, "final_refresh_s": final_refresh_s,
            **parts}


class _Parts:
    """Inside each engine's timed calls (Scheduler.schedule, update_from_output): the thread
    CPU time of Python's garbage collections and their count per generation (a collection
    runs on the thread whose allocation crossed a threshold, whoever allocated before), and
    the observed engine's synchronous refreshes (kvscope aggregating on vLLM's thread: the
    step that leaves the engine idle, ``SchedulerObserver.settle``). The marks are a frame
    around each timed call, the same in both engines."""

    def __init__(self, engines: dict[str, object]) -> None:
        self.main, self.inside = threading.get_ident(), [None]
        self.gc_s = {n: 0.0 for n in engines}
        self.collections = {n: [0, 0, 0] for n in engines}
        self.refresh_s = 0.0
        self._t0 = 0.0
        for name, e in engines.items():
            for method in ("schedule", "update_from_output"):
                inner = getattr(e.scheduler, method)

                def marked(*a, _inner=inner, _name=name, **kw):
                    self.inside[0] = _name
                    try:
                        return _inner(*a, **kw)
                    finally:
                        self.inside[0] = None

                setattr(e.scheduler, method, marked)
        observer = engines[OBSERVED].connector._kvscope_observer
        refresh = observer.refresh

        def timed_refresh(*a, **kw):
            if self.inside[0] is None or threading.get_ident() != self.main:
                return refresh(*a, **kw)
            t0 = time.thread_time()
            try:
                return refresh(*a, **kw)
            finally:
                self.refresh_s += time.thread_time() - t0

        observer.refresh = timed_refresh
        gc.callbacks.append(self._collected)

    def _collected(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
            return
        name = self.inside[0]
        if name is not None and threading.get_ident() == self.main:
            self.gc_s[name] += time.thread_time() - self._t0
            self.collections[name][info["generation"]] += 1

    def close(self) -> None:
        gc.callbacks.remove(self._collected)

    def of(self, name: str) -> dict:
        out = {"gc_s": self.gc_s[name], "gc_collections": self.collections[name]}
        if name == OBSERVED:
            out["refresh_in_step_s"] = self.refresh_s
        return out


def run_pair(n_requests: int, tiering: bool, flush_interval_s: float | None = None,
             per_key_lookups: bool = False, no_gc: bool = False,
             kvscope_threads: bool = True) -> list[dict]:
    """One stock and one observed engine in lockstep: step by step, alternating which
    goes first, so both see the same machine (load, clock, caches) at each moment:
    on a shared box, drift between whole runs is larger than the effect measured.
    ``no_gc``: Python's garbage collector off while they step (what collections cost).
    ``kvscope_threads=False``: none of kvscope's threads runs beside the timed calls
    (lockstep.engine), what they cost the engine's thread on a shared core."""
    with engine(STOCK, tiering) as stock, \
            engine(OBSERVED, tiering, flush_interval_s, per_key_lookups,
                   kvscope_threads) as observed:
        parts = _Parts({STOCK: stock, OBSERVED: observed})
        if no_gc:
            gc.collect()
            gc.disable()
        try:
            walls = lockstep([(stock, add_requests(stock, n_requests)),
                              (observed, add_requests(observed, n_requests))])
        finally:
            gc.enable()
            parts.close()
        threads_s = kvscope_threads_cpu(observed)
        stock.refresh()
        return [_result(STOCK, stock, walls[0], parts.of(STOCK)),
                _result(OBSERVED, observed, walls[1], parts.of(OBSERVED), threads_s,
                        final_refresh(observed))]


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
            write_stats(prof, profile_aggregator, "observer.py|aggregator|round_verdicts|"
                         "coverage|request_states|step_gauges|recorder|rounds.py|observed|"
                         "store_refusals|taps.py|vllm_stats|round_spans")
        return _result(connector, e, wall, {}, kvscope_threads_cpu(e))


def coverage_cost(n_requests: int, tiering: bool, rounds: int) -> None:
    """Time RoundVerdicts._coverage (once per ended lookup round) inside observed runs."""
    from kvscope.connector.lookup import round_verdicts as rv

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


# ---- --lookup-path: what each path of the lookup hot path costs, counted ---------------
PATHS = ("stock", "per_key", "scan", "tiered", "tiered_cache", "tiered_all")
_CG_SOURCE = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


def _callgrind() -> ctypes.CDLL:
    """The client requests, compiled into a temporary library."""
    d = tempfile.mkdtemp(prefix="kvscope-cg-")
    src, lib = os.path.join(d, "cg.c"), os.path.join(d, "libcg.so")
    with open(src, "w") as f:
        f.write(_CG_SOURCE)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", lib, src], check=True)
    return ctypes.CDLL(lib)


def _configure(path: str) -> dict:
    """kvscope's options for ``path``; the tiered paths' parts switched off where asked."""
    from kvscope.connector.lookup import prefix_scan
    from kvscope.connector.scheduler import observer

    if path == "tiered":  # no deferred-scan cache (4)
        observer.DeferredScans = lambda *a, **k: None
    if path in ("tiered", "tiered_cache"):  # no bare rest (5)
        prefix_scan.BARE_MIN_KEYS = 1 << 62
    return {"per_key_lookups": True} if path == "per_key" else {}


def _engine(path: str, tokens: int, delay: int, tiering: bool):
    from kvscope.sim import scale_workload as w
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig
    from kvscope.sim.lockstep import OBSERVED, STOCK

    connector = STOCK if path == "stock" else OBSERVED
    options = _configure(path)
    s = w.sizes(tokens, min_rows=48)
    if tiering:
        return w.engine(connector, s, 2048, delay, options), s.flood
    # the CPU tier alone keeps the prompt while the flood evicts it from the GPU blocks
    flood_keys = s.gpu_blocks + w.MARGIN
    rows = s.keys + flood_keys + 2 * w.MARGIN
    n = -(-flood_keys * w.BLOCK // tokens)
    flood = (-(-flood_keys // n) * w.BLOCK,) * n
    return CPUEngine(EngineConfig(
        rows=rows, tiering=False, world_size=1, kv_groups=1, num_gpu_blocks=s.gpu_blocks,
        max_num_batched_tokens=2048, max_num_seqs=4, max_model_len=tokens + 4 * w.BLOCK,
        connector=connector, step_time_s=0.0, kvscope_options=options)), flood


def _count(scheduler, cg: ctypes.CDLL | None, calls: collections.Counter,
           ops: collections.Counter, bytecodes: bool) -> None:
    """Count inside the scheduler's two calls from now on."""
    def tracer(frame, event, arg):
        if event == "call":
            frame.f_trace_opcodes, frame.f_trace_lines = True, False
            calls[_where(frame.f_code)] += 1
        elif event == "opcode":
            ops[_where(frame.f_code)] += 1
        return tracer

    for name in ("schedule", "update_from_output"):
        inner = getattr(scheduler, name)

        def counted(*a, _inner=inner, **kw):
            if cg is not None:
                cg.cg_toggle()
            elif bytecodes:
                sys.settrace(tracer)
            try:
                return _inner(*a, **kw)
            finally:
                if cg is not None:
                    cg.cg_toggle()
                else:
                    sys.settrace(None)

        setattr(scheduler, name, counted)


def _where(code) -> str:
    f = code.co_filename
    return "kvscope" if "/connector/" in f or "/exporters/" in f else "other"


def step_instructions(a) -> None:
    """``--instructions``: each connector's engine counted under callgrind, ``--rounds``
    times (the fs tier's threads time the scheduler's work a little differently each run);
    the median of the runs' ratios, and each run."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="kvscope-cg-") as d:
        for i in range(a.rounds):
            counts = {}
            for connector in (STOCK, OBSERVED) if i % 2 == 0 else (OBSERVED, STOCK):
                out = os.path.join(d, f"{connector}-{i}.out")
                cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                       "--collect-atstart=no", f"--callgrind-out-file={out}", sys.executable,
                       os.path.abspath(__file__), "--count-engine", connector, "--requests",
                       str(a.requests)]
                if a.no_tiering:
                    cmd.append("--no-tiering")
                # both engines of a run hash alike (a seed per run): a run's ratio is then
                # the connectors' difference, not two draws of string hashing's layout
                run = subprocess.run(cmd, check=True, capture_output=True, text=True,
                                     env={**os.environ, "PYTHONHASHSEED": str(i + 1)})
                engine_line = json.loads(run.stdout.strip().splitlines()[-1])
                counts[connector] = {"steps": engine_line["steps"],
                                     "instructions": _callgrind_total(out)}
            ratio = counts[OBSERVED]["instructions"] / counts[STOCK]["instructions"]
            runs.append({**counts, "ratio": round(ratio, 4)})
            print(json.dumps(runs[-1]), flush=True)
    ratios = [r["ratio"] for r in runs]
    print(json.dumps({
        "requests": a.requests, "tiering": not a.no_tiering, "rounds": a.rounds,
        "counted": "callgrind instructions", "ratios": ratios,
        "instruction_ratio_observed_over_stock": round(statistics.median(ratios), 4)}),
        flush=True)


def _callgrind_total(path: str) -> int:
    with open(path) as f:  # its header's "summary:" is 0 where collection starts late
        for line in f:
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise ValueError(f"{path}: no instruction total")


def count_engine(a) -> None:
    """``--count-engine C`` (under valgrind, from ``--instructions``): one engine of
    connector C through the timed workload, instructions collected inside the scheduler's
    two calls only; the journal applied after each step, outside them (no stats object
    prepared: see the module's doc)."""
    cg = _callgrind()
    options = 3600.0 if a.count_engine == OBSERVED else None  # the aggregator stays asleep
    with engine(a.count_engine, not a.no_tiering, options) as e:
        rids = add_requests(e, a.requests)
        _count(e.scheduler, cg, collections.Counter(), collections.Counter(), bytecodes=False)
        cg.cg_start()
        observer = getattr(e.connector, "_kvscope_observer", None)
        while any(r not in e.finished for r in rids):
            e.step()
            if observer is not None:  # the journal applied, as the aggregator thread does
                with observer.agg.lock:
                    observer.agg.drain()
            if e.steps > 100_000:
                raise TimeoutError("requests not done after 100000 steps")
        cg.cg_stop()
        print(json.dumps({"connector": a.count_engine, "steps": e.steps}), flush=True)


def lookup_path_cost(a) -> None:
    """``--lookup-path``: one engine's re-ask counted (see the module docstring)."""
    from kvscope.sim import scale_workload as w
    from kvscope.sim.cpu_engine import prompt
    from kvscope.sim.scale_pair import Pair

    cg = _callgrind() if a.callgrind else None
    engine, flood = _engine(a.lookup_path, a.tokens, a.delay, not a.no_tiering)
    with engine as e:
        pair = Pair([e])  # steps to completion, drains, counts the scans' keys
        target = prompt(1, a.tokens)
        pair.ask([target])
        for i, n in enumerate(flood):
            pair.ask([prompt(100 + i, n)])
        again = [[e.add_request(target, w.OUT)]]
        calls, ops = collections.Counter(), collections.Counter()
        _count(e.scheduler, cg, calls, ops, bytecodes=cg is None)
        scans0, keys0, steps0 = pair.keys[0].scans, pair.keys[0].keys, e.steps
        if cg is not None:
            cg.cg_start()
        pair.step(again)
        if cg is not None:
            cg.cg_stop()
        done = e.finished[again[0][0]]
        untapped = keys0 is not None
        print(json.dumps({
            "path": a.lookup_path, "tokens": a.tokens, "tiering": not a.no_tiering,
            "delay": a.delay, "steps": e.steps - steps0,
            "scans": pair.keys[0].scans - scans0 if untapped else None,
            "keys_looked_up": pair.keys[0].keys - keys0 if untapped else None,
            "restored_tokens": done.num_external_tokens,
            "calls": dict(calls), "bytecodes": dict(ops),
            "counted": "callgrind instructions (see its output)" if cg else "python"}),
            flush=True)



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
    p.add_argument("--lookup-path", choices=PATHS,
                   help="count one long re-ask's scheduler calls on this lookup path instead")
    p.add_argument("--tokens", type=int, default=16384, help="--lookup-path: prompt tokens")
    p.add_argument("--delay", type=int, default=8,
                   help="--lookup-path: steps each promotion is held (tiering): deferred re-scans")
    p.add_argument("--callgrind", action="store_true",
                   help="--lookup-path under valgrind's callgrind: count instructions")
    p.add_argument("--no-kvscope-threads", action="store_true",
                   help="kvscope's aggregator and tier probe never run beside the timed calls: "
                        "all aggregation at the idle step (refresh_in_step_points_median)")
    p.add_argument("--no-gc", action="store_true",
                   help="timed pairs: Python's garbage collector off while the engines step")
    p.add_argument("--instructions", action="store_true",
                   help="the step ratio in callgrind's instructions (valgrind needed)")
    p.add_argument("--count-engine", choices=(STOCK, OBSERVED), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.instructions:
        step_instructions(args)
        return
    if args.count_engine:
        count_engine(args)
        return
    if args.lookup_path:
        lookup_path_cost(args)
        return
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
    ratios, cpu_ratios, gc_points, refresh_points = [], [], [], []
    for _ in range(args.rounds):
        pair = run_pair(args.requests, not args.no_tiering, args.flush_interval,
                        args.per_key_lookups, args.no_gc, not args.no_kvscope_threads)
        for r in pair:
            runs[r["connector"]].append(r)
            print(json.dumps(r), flush=True)
        stock_s, obs = pair[0]["scheduler_s"], pair[1]
        ratios.append(obs["scheduler_s"] / stock_s)
        # Honest total: kvscope's work moved off the engine thread counted back in
        cpu_ratios.append((obs["scheduler_s"] + obs["kvscope_threads_s"]
                           + obs["final_refresh_s"]) / stock_s)
        # what of the ratio is collections, and the idle step's aggregation (in points)
        gc_points.append(100 * (obs["gc_s"] - pair[0]["gc_s"]) / stock_s)
        refresh_points.append(100 * obs["refresh_in_step_s"] / stock_s)
    med = {n: statistics.median(r["scheduler_s"] for r in rs) for n, rs in runs.items()}
    print(json.dumps({
        "requests": args.requests, "tiering": not args.no_tiering, "rounds": args.rounds,
        "per_key_lookups": args.per_key_lookups, "gc": not args.no_gc,
        "kvscope_threads": not args.no_kvscope_threads,
        "flush_interval_s": 3600.0 if args.no_kvscope_threads
        else _effective_interval(args.flush_interval),
        "scheduler_s_median": med,
        "kvscope_threads_s_median": statistics.median(
            r["kvscope_threads_s"] + r["final_refresh_s"] for r in runs[OBSERVED]),
        "pair_ratios": [round(x, 4) for x in ratios],
        "cpu_ratio_with_kvscope_threads": round(statistics.median(cpu_ratios), 4),
        "gc_points_median": round(statistics.median(gc_points), 2),
        "refresh_in_step_points_median": round(statistics.median(refresh_points), 2),
        "step_time_ratio_observed_over_stock": round(statistics.median(ratios), 4)}))


if __name__ == "__main__":
    main()
