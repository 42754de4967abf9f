"""The scheduler thread's CPU per key looked up during a long deferred restore through tiering:
kvscope's per-key lookup tap vs its scan tap (connector/prefix_scan.py ``tiered_scan_tap``).

A prompt of ``--keys`` chunks (16 tokens each) is stored, pushed out of the GPU and the CPU
tier by another, then asked again: restored from vLLM's fs tier with its promotions held
``--held`` steps (kvscope.sim.promotion_delay), so vLLM's connector scheduler re-scans every
key on every one of those steps (``_maximal_prefix_lookup``, deferred: the keys are RETRY,
then HIT_PENDING). Each deferred scan is timed on the scheduler thread's own clock
(``time.thread_time``) around the outermost ``_maximal_prefix_lookup`` (vLLM's lookups and
kvscope's tap, whichever is installed), divided by the keys it was given (a deferred scan of
a restore stops at no MISS: it consumes them all). Arms alternate (per-key, scan, per-key,
...) on fresh engines; the machine is shared: ``os.getloadavg`` is written before each run.

    python benchmarks/scan_tap_cost.py [--keys 4096] [--held 12] [--repeats 3] [--reps 30]
                                       [--out F]

Both arms' whole restores are noisy on a loaded machine; the scan-tap run also scans its
last deferred scan's keys again between two held steps, ``--reps`` times per arm, arms
interleaved in one process and one tier state (vLLM's scan alone, with the per-key tap,
with the scan tap: ``same_state_us_per_key``), which isolates the taps' cost.

One JSON line (appended to ``--out`` when given): per run, the arm, the deferred scans
timed, the keys they looked up, the scan CPU per key (us: median and mean over the scans),
the rounds' answers (deferred count, tokens hit at the end), the load average before.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def _run(keys: int, held: int, per_key: bool, reps: int = 30) -> dict:
    from kvscope.connector import compat
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

    r = random.Random(keys)
    prompts = [[r.randrange(1, 30_000) for _ in range(keys * 16)] for _ in range(2)]
    cfg = replace(EngineConfig(rows=keys + keys // 10, num_gpu_blocks=keys + 200,
                               max_num_batched_tokens=4096, max_num_seqs=4,
                               max_model_len=keys * 16 + 64, promotion_delay_steps=held,
                               kvscope_options={"per_key_lookups": per_key}),
                  tiering=True, kv_groups=1)
    load = os.getloadavg()[0]
    with CPUEngine(cfg) as e:
        observer = e.connector._kvscope_observer
        assert observer.lookups_from_scan is not per_key, "the arm's tap is not installed"
        e.generate(prompts[0], 2, max_steps=1_000)
        e.generate(prompts[1], 2, max_steps=1_000)  # evicts it from the GPU and the CPU tier
        e.drain(max_steps=1_000)
        cs = e.connector.connector_scheduler
        scan = getattr(cs, compat.SCAN_METHOD)
        per_scan: list[float] = []
        looked_up = [0]
        answers: list = []

        captured: list = []

        def timed(keys_, req_context, *rest):
            t0 = time.thread_time()
            n = scan(keys_, req_context, *rest)
            dt = time.thread_time() - t0
            if n is None and len(keys_) > keys // 2:
                per_scan.append(dt / len(keys_))
                looked_up[0] += len(keys_)
                captured[:] = [(keys_, req_context, rest)]
            return n

        setattr(cs, compat.SCAN_METHOD, timed)
        ask = e.connector.get_num_new_matched_tokens

        def counted(request, num_computed):
            out = ask(request, num_computed)
            answers.append(out[0])
            return out

        e.connector.get_num_new_matched_tokens = counted
        rid = e.add_request(prompts[0], 2)
        for _ in range(3):  # the restore deferred: its promotions started, held
            e.step()
        same_state = _same_state(cs, observer, scan, captured, reps) if not per_key else {}
        e.run_until_done([rid], max_steps=1_000)
        e.drain(max_steps=1_000)
    return {"arm": "per_key" if per_key else "scan", "load1_before": round(load, 2),
            "same_state_us_per_key": same_state,
            "deferred_scans": len(per_scan), "keys_looked_up": looked_up[0],
            "us_per_key_median": round(statistics.median(per_scan) * 1e6, 3),
            "us_per_key_mean": round(statistics.fmean(per_scan) * 1e6, 3),
            "deferred_rounds": answers.count(None), "hit_tokens_at_end": answers[-1]}


def _same_state(cs, observer, tap_scan, captured, reps: int) -> dict:
    """The last deferred scan's keys scanned again ``reps`` times per arm, arms interleaved,
    between two steps while every key's promotion is held (each lookup HIT_PENDING, nothing
    changes): vLLM's scan over vLLM's manager (stock), over the proxy's per-key tap
    (per_key), and kvscope's scan tap (scan). Median us per key; the log's slots trimmed
    after each call (untimed)."""
    from kvscope.connector import compat

    keys, ctx, rest = captured[0]
    proxy, log = cs.manager, observer.log
    stock_scan = getattr(type(cs), compat.SCAN_METHOD).__get__(cs)
    arms = {"stock": (proxy._inner, False, stock_scan), "per_key": (proxy, True, stock_scan),
            "scan": (proxy, False, tap_scan)}
    times: dict[str, list[float]] = {a: [] for a in arms}
    try:
        for _ in range(reps):
            for arm, (manager, per_key, scan) in arms.items():
                cs.manager = manager
                proxy.per_key(per_key)
                k0 = len(log.results)
                t0 = time.thread_time()
                n = scan(keys, ctx, *rest)
                times[arm].append((time.thread_time() - t0) / len(keys))
                del log.keys[k0:], log.results[k0:]
                assert n is None
    finally:
        cs.manager = proxy
        proxy.per_key(False)
    return {a: round(statistics.median(t) * 1e6, 3) for a, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=4096)
    p.add_argument("--held", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out")
    a = p.parse_args()
    import vllm

    runs = []
    for _ in range(a.repeats):
        for per_key in (True, False):  # alternated: the shared machine's load drifts
            runs.append(_run(a.keys, a.held, per_key, a.reps))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    summary = {arm: round(statistics.median(r["us_per_key_median"] for r in runs
                                            if r["arm"] == arm), 3)
               for arm in ("per_key", "scan")}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    same = {arm: round(statistics.median(r["same_state_us_per_key"][arm] for r in runs
                                         if r["same_state_us_per_key"]), 3)
            for arm in ("stock", "per_key", "scan")}
    line = json.dumps({"commit": commit, "vllm": vllm.__version__,
                       "command": "python " + " ".join(sys.argv), "keys": a.keys,
                       "held": a.held, "median_us_per_key": summary,
                       "saved_us_per_key": round(summary["per_key"] - summary["scan"], 3),
                       "same_state_median_us_per_key": same,
                       "same_state_saved_us_per_key": round(same["per_key"] - same["scan"], 3),
                       "runs": runs})
    print(line)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
