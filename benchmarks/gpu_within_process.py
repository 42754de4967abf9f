"""What kvscope costs a scheduler-bound GPU serving workload, resolved within one process.

Fresh stock and observed processes of one configuration spread by +-7 % (bimodal in earlier
runs: docs/measured-facts.md), so a ratio's 95 % CI over 11 fresh processes was 0.957-1.109. Here each process loads the same engine with ``ObservedOffloadingConnector`` and
alternates its iterations between kvscope **on** and **off** (kvscope.sim.kvscope_switch:
off is vLLM's stock path), in ABBA order (pair j: on then off for even j, off then on for
odd j), so the process's own mode, memory placement and drift are shared by both arms of
every pair. The workload and model of kvscope.sim.gpu_workload: an iteration asks 96 new
1,024-token prompts (96 out), then the previous iteration's 96 again, restoring ~96 x 1,008
tokens from the CPU tier (engine truth: ``num_cached_tokens``, recorded per iteration).

Between iterations the engine is settled (vLLM's scheduler holds no request and its
offloading connector no transfer job: a store job still in flight completes only while the
engine steps, so tiny requests are run until then, outside the timed region),
then switched. The timed region is the two ``generate`` calls. Reported per mode: the
geometric mean over pairs of tokens/s(on) / tokens/s(off) = t_off / t_on, with a t interval
and a bootstrap interval over pairs, and per process. Checked per process: every re-ask
restored the same tokens in both arms, and kvscope's own hit counter grew by exactly the
tokens restored while it was on (so on was observed and off was not).

Needs the in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the switch reaches the
scheduler and the worker's connector in this process.

    python3 benchmarks/gpu_within_process.py all --processes 2 --modes sync async --pairs 40 --out R.json
    python3 benchmarks/gpu_within_process.py case --mode sync --pairs 40
    python3 benchmarks/gpu_within_process.py summarize R.json [R2.json ...]
    python3 benchmarks/gpu_within_process.py premise R.json [R2.json ...]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

from kvscope.sim import gpu_workload as gsb
from kvscope.sim import thread_cpu
from kvscope.sim.call_clock import SCHEDULER_CALLS, WORKER_CALLS, CallClock, clocks_per_call
from kvscope.sim.kvscope_switch import KvscopeSwitch, quiet
from kvscope.sim.pair_stats import out_of_time, premise, summarize, summarize_iters

T_START = time.monotonic()  # this process's start: a case's deadline counts from it
# Seconds before the parent's case timeout that a case's deadline falls (its exit: engine
# shutdown, the last JSON line)
DEADLINE_MARGIN_S = 15
SETTLE_PROMPT = {"prompt_token_ids": [7, 8, 9]}  # shorter than a block: stores nothing
PROBE_N = 300_000  # ~10-20 ms of pure Python on the engine's thread


def cpu_probe() -> float:
    """Seconds of a fixed pure-Python loop on this thread, run idle between iterations (no
    request, kvscope's threads idle): how fast the host runs the engine's thread just then.
    Run 1 showed the scheduler's own CPU time for the same work moving +-12 % between
    adjacent iterations, in stretches: the host's speed, a covariate outside the arms."""
    t = time.perf_counter()
    x = 0
    for i in range(PROBE_N):
        x += i & 7
    return time.perf_counter() - t


def states(pairs: int) -> list[bool]:
    """ABBA: pair j is (on, off) for even j, (off, on) for odd j."""
    out: list[bool] = []
    for j in range(pairs):
        out += [True, False] if j % 2 == 0 else [False, True]
    return out


# Iterations between two checkpoints of a case (10 pairs), printed between iterations
CHECKPOINT_ITERS = 20


def run_case(mode: str, pairs: int, warmup: int, pin: str, cpu_bytes: int,
             deadline: float | None = None) -> dict:
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise SystemExit("needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (the engine in this process)")
    t_import = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    import_s = round(time.perf_counter() - t_import, 1)
    d = tempfile.mkdtemp(prefix="kvscope-1b-")
    gsb.write_config(d)
    port = gsb.free_port()
    ktc = KVTransferConfig(
        kv_connector="ObservedOffloadingConnector", kv_connector_module_path="kvscope.connector",
        kv_role="kv_both",
        kv_connector_extra_config={"cpu_bytes_to_use": cpu_bytes, "block_size": 16,
                                   "kvscope": {"exporter_port": port}})
    t0 = time.perf_counter()
    llm = LLM(model=d, skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16",
              block_size=16, num_gpu_blocks_override=gsb.GPU_BLOCKS, max_model_len=2048,
              max_num_seqs=128, gpu_memory_utilization=0.5, enable_prefix_caching=True,
              kv_transfer_config=ktc, disable_log_stats=False, seed=0,
              async_scheduling=(mode == "async"),
              compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32, 48, 64,
                                                              96, 128]})
    res: dict = {"mode": mode, "engine_up_s": round(time.perf_counter() - t0, 1),
                 "vllm_import_s": import_s, "cpu_tier_gib": round(cpu_bytes / (1 << 30), 2),
                 "affinity": sorted(os.sched_getaffinity(0)), "pid": os.getpid()}
    if pin == "main":
        res["pin_main"] = gsb.pin_main_thread()
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    switch = KvscopeSwitch(scheduler, [get_kv_transfer_group()])
    # whether the round's lookups come from the prefix scan (connector/lookup/prefix_scan.py)
    res["lookups_from_scan"] = switch.observer.lookups_from_scan
    # The engine thread's CPU inside schedule() + update_from_output() (every scheduler-side
    # connector call): the scheduler's share of an iteration, which bounds what the
    # CPU-measured residual of kvscope switched off (results/kvscope_switch_residual_cpu.jsonl) can cost
    # here. Both arms pay it.
    sched_cpu = CallClock().wrap(scheduler, "schedule").wrap(scheduler, "update_from_output")
    # vLLM's output processing (frontend, same thread): no kvscope code runs in it and both
    # arms give it the same outputs, so its CPU time tracks the host's speed during the
    # iteration (a covariate; its own on/off ratio is reported to show it is not an arm's)
    out_cpu = CallClock().wrap(llm.llm_engine.output_processor, "process_outputs")
    # ... plus the model runner's input preparation: a larger sample of the same
    # (vllm_cpu_s = output_cpu_s + runner_cpu_s)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker \
        .model_runner
    runner_cpu = clock_calls(runner, RUNNER_CALLS)
    res["covariate_calls"] = [n for n in RUNNER_CALLS if callable(getattr(runner, n, None))]
    # Where kvscope's calls run on the engine thread: the connector's scheduler-role calls
    # (inside schedule() / update_from_output()), its worker-role calls (inside the model
    # runner), vLLM's stat loggers (kvscope's series pass through them)
    # one clock per method (which call kvscope's time is in); the roles' sums are fields too
    per_call = {**clocks_per_call(scheduler.connector, SCHEDULER_CALLS, "s."),
                **clocks_per_call(get_kv_transfer_group(), WORKER_CALLS, "w.")}
    switch.clocks += list(per_call.values())  # re-wrapped at each switch
    stat_cpu = clock_calls(llm.llm_engine.logger_manager, ("record",))
    steps = StepCount(scheduler)
    sync_refresh = CallClock().wrap(switch.observer, "refresh")  # the engine thread's own
    sp = SamplingParams(temperature=0.0, max_tokens=gsb.OUT, ignore_eos=True, detokenize=False)
    tiny = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    hits = f"http://127.0.0.1:{port}/metrics"

    def settle() -> int:
        for n in range(200):
            if quiet(scheduler):
                return n
            llm.generate([SETTLE_PROMPT], tiny, use_tqdm=False)
        raise RuntimeError("engine not quiet after 200 settling requests")

    llm.generate(gsb.batch(-1), sp, use_tqdm=False)  # the first re-ask's batch
    order = [k % 2 == 0 for k in range(warmup)] + states(pairs)  # warm both states
    iters: list[dict] = []
    hits_on = hits0 = 0.0
    pair_s: list[float] = []  # wall seconds of each whole pair, settling included
    pair_t = time.monotonic()
    for k, on in enumerate(order):
        if k >= warmup and (k - warmup) % 2 == 0:  # a pair starts
            now = time.monotonic()
            if k > warmup:
                pair_s.append(now - pair_t)
            pair_t = now
            if out_of_time(now, deadline, pair_s):
                res["stopped"] = "deadline"
                break
        settled = settle()
        switch.set(on)
        probe = cpu_probe()
        if k == warmup:
            hits0 = scrape_hits(hits)
        gc_watch = gsb.GCWatch()
        gc.callbacks.append(gc_watch)
        clocks = {"scheduler_cpu_s": sched_cpu, "output_cpu_s": out_cpu,
                  "runner_cpu_s": runner_cpu, "sync_refresh_cpu_s": sync_refresh,
                  "stat_logger_cpu_s": stat_cpu}
        clocks0 = {n: c.seconds for n, c in clocks.items()}
        calls0 = {n: c.seconds for n, c in per_call.items()}
        steps0 = steps.counts()
        threads0 = thread_cpu.snapshot()
        t = time.perf_counter()
        new = llm.generate(gsb.batch(k), sp, use_tqdm=False)
        again = llm.generate(gsb.batch(k - 1), sp, use_tqdm=False)
        dt = time.perf_counter() - t
        threads = thread_cpu.between(threads0, thread_cpu.snapshot())
        gc.callbacks.remove(gc_watch)
        restored = sum(o.num_cached_tokens or 0 for o in again)
        if k >= warmup:
            calls = {n: round(c.seconds - calls0[n], 5) for n, c in per_call.items()}
            iters.append({"on": on, "s": round(dt, 4), "restored": restored,
                          "new_cached": sum(o.num_cached_tokens or 0 for o in new),
                          **{n: round(c.seconds - clocks0[n], 4) for n, c in clocks.items()},
                          "vllm_cpu_s": round(out_cpu.seconds - clocks0["output_cpu_s"]
                                              + runner_cpu.seconds - clocks0["runner_cpu_s"], 4),
                          "sched_connector_cpu_s": role_sum(calls, "s."),
                          "worker_connector_cpu_s": role_sum(calls, "w."), "calls": calls,
                          "gc_s": round(gc_watch.seconds, 4), "gc": gc_watch.count,
                          "settle_requests": settled, "probe_s": round(probe, 5),
                          "threads": threads,
                          **{n: b - a for n, a, b in zip(StepCount.NAMES, steps0,
                                                          steps.counts())}})
            if on:
                hits_on += restored
            if len(iters) % CHECKPOINT_ITERS == 0 and len(iters) < 2 * pairs:
                # what the pairs so far show, on stdout: a run the case timeout cuts keeps
                # them (gsb.run_case_process); the scrape drains kvscope's journal first
                print(json.dumps({**res, "pairs": len(iters) // 2, "warmup": warmup,
                                  "iters": iters, "partial": True,
                                  "kvscope_hit_tokens_seen": scrape_hits(hits) - hits0,
                                  "restored_while_on": hits_on,
                                  "summary": summarize_iters(iters)}), flush=True)
    settle()
    switch.set(True)
    hits_seen = scrape_hits(hits) - hits0
    tokens = sum(len(p["prompt_token_ids"]) + gsb.OUT for p in gsb.batch(0)) * 2
    res.update(pairs=len(iters) // 2, pairs_asked=pairs, warmup=warmup,
               tokens_per_iter=tokens, iters=iters, kvscope_hit_tokens_seen=hits_seen,
               restored_while_on=hits_on, summary=summarize_iters(iters))
    return res


# The model runner's input preparation (names differ between runner versions)
RUNNER_CALLS = ("_update_states", "_prepare_inputs", "update_states", "prepare_inputs",
                "_prepare_input_ids", "_calc_spec_decode_metadata")


def clock_calls(owner, names) -> CallClock:
    clock = CallClock()
    for name in names:
        if callable(getattr(owner, name, None)):
            clock.wrap(owner, name)
    return clock


def role_sum(calls: dict[str, float], prefix: str) -> float:
    return round(sum(v for n, v in calls.items() if n.startswith(prefix)), 4)


class StepCount:
    """Calls of vLLM's ``schedule()``, and those that scheduled no token (an engine
    waiting for loads steps on; kvscope refreshes synchronously on such a step only when
    no load is in flight: the idle state)."""

    NAMES = ("schedules", "empty_schedules")

    def __init__(self, scheduler) -> None:
        self.calls = self.empty = 0
        inner = scheduler.schedule

        def counted(*a, **kw):
            out = inner(*a, **kw)
            self.calls += 1
            if not out.total_num_scheduled_tokens:
                self.empty += 1
            return out

        scheduler.schedule = counted

    def counts(self) -> tuple[int, int]:
        return self.calls, self.empty


def scrape_hits(url: str) -> float:
    got = gsb.scrape(url, ("kvscope_hit_tokens_total",))
    if "error" in got:
        raise RuntimeError(f"kvscope endpoint: {got['error']}")
    return sum(got.values())


def spawn(mode: str, args) -> dict:
    # the case stops between pairs before the parent's timeout would cut it (its start,
    # vLLM's import and the engine's, counts: the deadline runs from the spawn)
    cmd = [sys.executable, os.path.abspath(__file__), "case", "--mode", mode,
           "--pairs", str(args.pairs), "--warmup", str(args.warmup), "--pin", args.pin,
           "--cpu-gib", str(args.cpu_gib),
           "--deadline-s", str(max(args.case_timeout - DEADLINE_MARGIN_S, 0))]
    return gsb.run_case_process(cmd, args.case_timeout, {"mode": mode})[0]


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("case")
    c.add_argument("--mode", choices=["sync", "async"], default="sync")
    c.add_argument("--deadline-s", type=float, default=None,
                   help="seconds from start after which no pair starts that could run past it")
    a = sub.add_parser("all")
    a.add_argument("--processes", type=int, default=2, help="per mode")
    a.add_argument("--modes", nargs="+", default=["sync", "async"])
    a.add_argument("--out", default="gpu_within_process.json")
    a.add_argument("--case-timeout", type=float, default=560)
    for q in (c, a):
        q.add_argument("--pairs", type=int, default=40)
        q.add_argument("--warmup", type=int, default=2)
        q.add_argument("--pin", default="main", help="as kvscope.sim.gpu_workload.pin_cpus")
        q.add_argument("--cpu-gib", type=float, default=12.0)
    s = sub.add_parser("summarize")
    s.add_argument("files", nargs="+")
    q = sub.add_parser("premise", help="the covariates' own on/off over all pairs of the files")
    q.add_argument("files", nargs="+")
    args = p.parse_args()
    if args.cmd in ("summarize", "premise"):
        runs = [r for f in args.files for r in json.load(open(f))["runs"]]
        print(json.dumps((summarize if args.cmd == "summarize" else premise)(runs), indent=1))
        return 0
    if args.cmd == "case":
        cpus = gsb.pin_cpus(args.pin)
        if cpus:
            os.sched_setaffinity(0, cpus)  # before vLLM starts its threads: they inherit it
        deadline = None if args.deadline_s is None else T_START + args.deadline_s
        print(json.dumps(run_case(args.mode, args.pairs, args.warmup, args.pin,
                                  int(args.cpu_gib * (1 << 30)), deadline)), flush=True)
        return 0
    runs: list[dict] = []
    result = {"command": " ".join(sys.argv), "runs": runs}
    for _ in range(args.processes):
        for mode in args.modes:
            runs.append(spawn(mode, args))
            r = runs[-1]
            print(json.dumps({k: r.get(k) for k in ("mode", "engine_up_s", "process_s",
                                                    "summary", "error", "tail")}), flush=True)
            result["summary"] = summarize(runs)
            with open(args.out, "w") as f:  # after every process: a cut run keeps its data
                json.dump(result, f, indent=1)
    print(json.dumps(result.get("summary")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
