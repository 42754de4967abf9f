"""A long restore whose disk reads race vLLM's engine thread for the GIL, on CPU: kvscope
switched on and off in one process (ABBA pairs, kvscope_switch.py), vLLM's real scheduler,
the fs tier's read threads racing the steps (``settle_tiers`` off), as beside a real engine.

Why: while a restore waits for its promotions, vLLM's engine thread re-scans the request's
keys every step (pure Python, nothing else to run), and the fs tier's read threads need the
GIL between their system calls. On the H200 a 131k-token restore's reads take ~1 s, and once
in a while 25 s (gpu_scale.py: one job of 8,187 reads starved by the engine thread's scans,
no churn, no failure; docs/measured-facts.md). On a 2-core machine that
starved regime is the usual one, so an A/B here measures what kvscope does to a restore in
the regime where it is slowest: its reads' time and the restore's, per arm.

Per iteration (gpu_scale.py's, on CPU): prompt k+1 asked (its prefill evicts prompt k from
the GPU blocks and the primary tier, its chunks cascade to disk), the tiers settled, then
prompt k asked again: the timed restore. Engine truth per re-ask: tokens vLLM loaded from the
tiers and the output, equal to the first ask's; vLLM's promotions (promotion_count.py).
The restore benchmarks' schedules are proven on it (``run``, CPU-sized, in the tests).

``between="restore"`` re-asks prompts 0, 1 and 2 in turn, each evicted by the others'
restores, with no prefill before a timed restore (reask_schedule.py). ``step_time_s``
gives each step a wall time in which the engine thread sleeps (a GPU forward's wait: the
reads get the GIL then, as on the H200 in its usual regime);
``hold_modes=("reads", "none")`` alternates, by blocks of two ABBA pairs, whether kvscope's
aggregator holds back while a restore's promotion reads (its default) or drains every
interval, and reports each mode's ratio and how they differ (``by_hold``). Every re-ask also
records the garbage collections that ran in it (count per generation, their thread CPU:
``gc``); ``gc_freeze`` freezes the heap once the engine is built, as vLLM's EngineCore does.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import sys
import time

from kvscope.sim import thread_cpu
from kvscope.sim.gc_clock import GCClock
from kvscope.sim.kvscope_switch import KvscopeSwitch, quiet
from kvscope.sim.pair_stats import abba, block_mode, by_hold, interval, pair_logs, pairs_of
from kvscope.sim.promotion_count import PromotionCount
from kvscope.sim.reask_schedule import asked_again, first_asks, iteration
from kvscope.sim.scale_workload import telemetry_errors

BLOCK = 16
OUT = 2


def settle(e, manager, limit: int = 20_000) -> None:
    """No request, no connector job, no tier job (vLLM's own test): steps until then."""
    for _ in range(limit):
        if quiet(e.scheduler) and not manager.has_pending_work():
            return
        e.step()
        time.sleep(0.001)  # the fs tier's threads finish what is in flight
    raise RuntimeError(f"engine not settled after {limit} steps")


def engine_config(tokens: int, step_time_s: float = 0.0):
    """One prompt's rows and GPU blocks, and a little more; the fs tier's threads racing."""
    from kvscope.sim.cpu_engine import EngineConfig

    keys = tokens // BLOCK
    return EngineConfig(rows=keys + keys // 8, tiering=True, world_size=1, kv_groups=1,
                        num_gpu_blocks=keys + 64, max_num_batched_tokens=8192, max_num_seqs=4,
                        max_model_len=tokens + 4 * BLOCK, settle_tiers=False,
                        step_time_s=step_time_s)


def evict(e, switch: KvscopeSwitch, on: bool, tokens: int, p: int | None) -> list[int] | None:
    """kvscope switched ``on`` or off, prompt ``p`` asked (it evicts the timed prompt, whose
    chunks are on disk; None: nothing asked, the last re-ask evicted it, reask_schedule.py) and
    the engine settled, so every row of the restore is free: the step before each timed
    re-ask. Returns prompt ``p``'s output."""
    from kvscope.sim.cpu_model import prompt

    settle(e, switch.manager)
    switch.set(on)
    if p is None:
        return None
    out = e.generate(prompt(p, tokens), OUT, max_steps=10**6).output
    settle(e, switch.manager)  # its cascades on disk: every row of the restore free
    return out


def run(tokens: int, pairs: int, warmup: int, step_time_s: float = 0.0,
        hold_modes: tuple[str, ...] = ("reads",), gc_freeze: bool = False,
        between: str = "prefill") -> dict:
    from kvscope.sim.cpu_engine import CPUEngine
    from kvscope.sim.cpu_model import prompt

    keys = tokens // BLOCK
    cfg = engine_config(tokens, step_time_s)
    res: dict = {"tokens": tokens, "keys": keys, "rows": cfg.rows, "cmd": sys.argv,
                 "cpus": os.cpu_count(), "step_time_s": step_time_s,
                 "hold_modes": list(hold_modes), "gc_freeze": gc_freeze, "between": between}
    collections = GCClock()
    with CPUEngine(cfg) as e:
        if gc_freeze:  # the startup heap out of the collector's view, as vLLM's EngineCore does
            gc.collect()
            gc.freeze()
        gc.callbacks.append(collections)
        switch = KvscopeSwitch(e.scheduler, [r.connector for r in e.ranks])
        promotions = PromotionCount(switch.manager)
        switch.clocks.append(promotions)
        first = {}
        for j in first_asks(between):
            settle(e, switch.manager)
            first[j] = e.generate(prompt(j, tokens), OUT, max_steps=10**6).output
        iters = []
        for k, on in enumerate(abba(warmup, pairs)):
            mode = block_mode(hold_modes, k, warmup)
            switch.hold_back(mode)
            p, timed = iteration(between, k)
            out = evict(e, switch, on, tokens, p)
            if out is not None:
                first[p] = out
            p0, s0, th0 = promotions.snapshot(), e.steps, thread_cpu.snapshot()
            gc0 = collections.totals()
            promotions.longest_job_s = 0.0
            t0 = time.perf_counter()
            again = e.generate(prompt(timed, tokens), OUT, max_steps=10**6)
            s = time.perf_counter() - t0
            jobs, promoted, failed = (b - a for a, b in zip(p0, promotions.snapshot()))
            threads = thread_cpu.between(th0, thread_cpu.snapshot())
            gc1 = collections.totals()
            want = first[timed] if asked_again(between) else first.pop(timed)
            it = {"k": k, "on": on, "hold": mode, "prompt": timed, "s": round(s, 4),
                  "steps": e.steps - s0, "loaded": again.num_external_tokens,
                  "same_output": again.output == want,
                  "promotions": {"jobs": jobs, "keys": promoted, "failed_keys": failed,
                                 "longest_job_s": round(promotions.longest_job_s, 4)},
                  "threads": {n: round(v["cpu_s"], 4) for n, v in threads.items()},
                  "gc": {"collections": [b - a for a, b in zip(gc0[0], gc1[0])],
                         "cpu_s": round(gc1[1] - gc0[1], 4)}}
            print(json.dumps(it), flush=True)
            if k >= warmup:
                iters.append(it)
        gc.callbacks.remove(collections)
        settle(e, switch.manager)
        switch.set(True)
        res["telemetry_errors"] = telemetry_errors(e)
    res["iters"] = iters
    res["checks"] = {"loaded": sorted({i["loaded"] for i in iters}),
                     "same_output": all(i["same_output"] for i in iters),
                     "promoted_keys": sorted({i["promotions"]["keys"] for i in iters}),
                     "failed_keys": sum(i["promotions"]["failed_keys"] for i in iters)}
    res["summary"] = summary(iters)
    res.update(by_hold(iters, summary))
    return res


def summary(iters: list[dict]) -> dict:
    out = interval(pair_logs(iters))
    for arm, name in ((True, "on"), (False, "off")):
        xs = [i for i in iters if i["on"] is arm]
        out[name] = {"median_restore_s": statistics.median(i["s"] for i in xs),
                     "median_read_job_s": statistics.median(i["promotions"]["longest_job_s"]
                                                            for i in xs),
                     "median_steps": statistics.median(i["steps"] for i in xs),
                     "median_kvscope_threads_cpu_s": statistics.median(
                         i["threads"]["kvscope"] for i in xs)}
        if all("gc" in i for i in xs):  # files before the GC clock have none
            out[name]["median_gc_cpu_s"] = statistics.median(i["gc"]["cpu_s"] for i in xs)
            out[name]["full_collections"] = sum(i["gc"]["collections"][2] for i in xs)
    # the read job's ratio as the restore's: log(off / on) per pair
    out["read_job"] = interval([math.log(off["promotions"]["longest_job_s"]
                                         / on["promotions"]["longest_job_s"])
                                for on, off in pairs_of(iters)])
    return out
