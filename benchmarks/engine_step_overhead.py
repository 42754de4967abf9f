"""Whole engine step time: ObservedOffloadingConnector vs the stock OffloadingConnector.

    python benchmarks/engine_step_overhead.py [--requests 1000] [--rounds 3] [--no-tiering]
        [--worker-calls] [--label TEXT] [--out results/engine_step_overhead.jsonl]
    python benchmarks/engine_step_overhead.py --profile F.txt [--profile-connector NAME]

``scheduler_overhead.py`` times only ``Scheduler.schedule()`` + ``update_from_output()``.
With TP=1 vLLM's engine core also runs, on the same thread, the worker-side connector
calls (``start_load_kv``, ``get_finished``, ``get_kv_connector_stats``, the offloading
worker's submissions) and, in-process, vLLM's ``PrometheusStatLogger.record``. This
times the WHOLE CPU engine step (``kvscope.sim.cpu_engine``, ``vllm_metrics=True``) on the
engine thread's CPU clock, minus the harness's fake model forward and sampling (and its
tier settling), for a stock and an observed engine in lockstep (step by step, alternating
which goes first; see ``scheduler_overhead.py`` for why). Per run: the step split into
the scheduler calls, vLLM's stat logger, and the rest (worker-side connector calls, the
KV output aggregation, ...). The ratio reported is the median over rounds of each pair's
``step_minus_forward`` ratio. The load average is recorded with every line.
``--worker-calls``: also the CPU time inside the worker-role connector calls the harness
makes per step (``worker_calls_s``, on the same clock; part of the rest), kvscope's
worker side alone.
``--profile F.txt``: one engine alone, cProfile on the engine thread's CPU clock over its
whole steps; the worker-side connector calls and vLLM's stat logger, as text.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from call_clock import CallClock  # noqa: E402
from scheduler_overhead import (  # noqa: E402
    OBSERVED,
    STOCK,
    _add_requests,
    _kvscope_threads_cpu,
    lockstep,
    workload_args,
)


def _engine(connector: str, tiering: bool):
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

    return CPUEngine(EngineConfig(rows=512, tiering=tiering, world_size=1, kv_groups=1,
                                  num_gpu_blocks=512, max_num_batched_tokens=512,
                                  max_num_seqs=32, connector=connector, step_time_s=0.0,
                                  vllm_metrics=True))


# The worker-role connector calls the harness makes per step (kvscope.sim.engine_step)
WORKER_CALLS = ("handle_preemptions", "bind_connector_metadata", "start_load_kv",
                "wait_for_save", "get_finished", "get_transfer_results",
                "get_block_ids_with_load_errors", "get_kv_connector_stats",
                "build_connector_worker_meta", "clear_connector_metadata")


def _clocks(e, worker_calls: bool = False) -> dict[str, CallClock]:
    """The harness's fake forward (and its tier settling) and vLLM's stat logger; with
    ``worker_calls`` the ranks' worker-role connector calls too."""
    forward, logger = CallClock(), CallClock()
    forward.wrap(e.model, "forward")
    forward.wrap(e.model, "sample_all")
    forward.wrap(e, "_settle_tiers")
    logger.wrap(e.stat_logger, "record")
    clocks = {"forward": forward, "logger": logger}
    if worker_calls:  # one clock per call name (summed over ranks)
        for name in WORKER_CALLS:
            clock = CallClock()
            for rank in e.ranks:
                if hasattr(rank.connector, name):
                    clock.wrap(rank.connector, name)
            clocks["worker." + name] = clock
    return clocks


def _result(connector: str, e, step_s: float, clocks: dict[str, CallClock],
            threads_s: float = 0.0) -> dict:
    fwd, log = clocks["forward"].seconds, clocks["logger"].seconds
    net = step_s - fwd
    by_call = {k.split(".", 1)[1]: c.seconds for k, c in clocks.items()
               if k.startswith("worker.")}
    worker = {"worker_calls_s": round(sum(by_call.values()), 4),
              "worker_calls_us_per_step": {k: round(1e6 * v / e.steps, 1)
                                           for k, v in by_call.items()}} if by_call else {}
    return {"connector": connector, "steps": e.steps,
            "step_minus_forward_s": round(net, 4),
            "per_step_us": round(1e6 * net / e.steps, 1),
            "scheduler_s": round(e.scheduler_seconds, 4), "stat_logger_s": round(log, 4),
            "rest_s": round(net - e.scheduler_seconds - log, 4),
            **worker, "forward_s": round(fwd, 4), "kvscope_threads_s": round(threads_s, 4),
            "loadavg": round(os.getloadavg()[0], 2)}


def run_pair(n_requests: int, tiering: bool, worker_calls: bool = False) -> list[dict]:
    with _engine(STOCK, tiering) as stock, _engine(OBSERVED, tiering) as observed:
        todo = [(stock, _add_requests(stock, n_requests)),
                (observed, _add_requests(observed, n_requests))]
        clocks = [_clocks(stock, worker_calls), _clocks(observed, worker_calls)]
        spent = lockstep(todo, time.thread_time)
        threads_s = _kvscope_threads_cpu(observed)
        return [_result(STOCK, stock, spent[0], clocks[0]),
                _result(OBSERVED, observed, spent[1], clocks[1], threads_s)]


def profile(connector: str, n_requests: int, tiering: bool, path: str) -> None:
    import cProfile
    import io
    import pstats

    with _engine(connector, tiering) as e:
        rids = _add_requests(e, n_requests)
        prof = cProfile.Profile(time.thread_time)
        while any(r not in e.finished for r in rids):
            prof.enable()
            e.step()
            prof.disable()
        steps = e.steps
    out = io.StringIO()
    out.write(f"# {connector}, tiering={tiering}, {n_requests} requests, {steps} steps, "
              f"load average {os.getloadavg()[0]:.2f}\n")
    stats = pstats.Stats(prof, stream=out).strip_dirs()
    stats.sort_stats("cumulative").print_stats(
        "observed|worker_side|worker_tally|vllm_stats|offloading_connector|offloading/worker|"
        "loggers|metrics|recorder|engine_step\\.py", 45)
    with open(path, "w") as f:
        f.write(out.getvalue())


def main() -> None:
    p = workload_args(argparse.ArgumentParser())
    p.add_argument("--worker-calls", action="store_true",
                   help="also time the worker-role connector calls (worker_calls_s)")
    p.add_argument("--label", default="", help="recorded with every line (e.g. a commit)")
    p.add_argument("--out", help="also append every line to this JSONL file")
    p.add_argument("--profile", help="cProfile one engine's whole steps; text into this file")
    p.add_argument("--profile-connector", default=OBSERVED, choices=[OBSERVED, STOCK])
    args = p.parse_args()
    tiering = not args.no_tiering
    if args.profile:
        profile(args.profile_connector, args.requests, tiering, args.profile)
        return
    out = open(args.out, "a") if args.out else None

    def emit(row: dict) -> None:
        line = json.dumps({"label": args.label, "tiering": tiering, **row})
        print(line, flush=True)
        if out is not None:
            out.write(line + "\n")
            out.flush()

    ratios, parts = [], {"scheduler_s": [], "stat_logger_s": [], "rest_s": []}
    if args.worker_calls:
        parts["worker_calls_s"] = []
    by_call: dict[str, list[float]] = {}  # observed minus stock, µs per step, per call
    for _ in range(args.rounds):
        stock, obs = run_pair(args.requests, tiering, args.worker_calls)
        emit(stock)
        emit(obs)
        ratios.append(obs["step_minus_forward_s"] / stock["step_minus_forward_s"])
        for k, v in parts.items():  # observed minus stock, per step
            v.append(1e6 * (obs[k] - stock[k]) / obs["steps"])
        for k, us in obs.get("worker_calls_us_per_step", {}).items():
            by_call.setdefault(k, []).append(us - stock["worker_calls_us_per_step"][k])
    emit({"requests": args.requests, "rounds": args.rounds,
          "pair_ratios": [round(x, 4) for x in ratios],
          "extra_us_per_step_median": {k: round(statistics.median(v), 1)
                                       for k, v in parts.items()},
          **({"worker_calls_extra_us_per_step_median": {
              k: round(statistics.median(v), 1) for k, v in by_call.items()}}
             if by_call else {}),
          "engine_step_ratio_observed_over_stock": round(statistics.median(ratios), 4)})
    if out is not None:
        out.close()


if __name__ == "__main__":
    main()
