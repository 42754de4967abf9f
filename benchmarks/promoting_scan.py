"""Scan by scan, the scheduler thread's CPU in a long restore's prefix scans, stock vs observed,
on vLLM's real scheduler on CPU: above all the *promoting* scan (the one that starts the
restore's ~8,190 promotions, each evicting a row of the full primary tier), the one scan of a
restore whose cost kvscope adds to on the H200 (benchmarks/README.md, runs G-I).

Workload (scale_workload.py): a ``--tokens`` prompt asked, flooded out of the GPU blocks and
the primary tier, asked again: restored from the fs tier, each promotion held ``--delay``
steps so the re-ask's scan repeats. The engine's startup heap is frozen, as vLLM's EngineCore
freezes it (``freeze_gc_heap``). Per scan of the re-ask: thread CPU (``time.thread_time``) around the
outermost ``_maximal_prefix_lookup`` (kvscope's tap and vLLM's scan), the collections that ran
inside it (scheduler_gc_diag.GCClock; the files before 2026-12-04 19:50 timed them in wall time) and the primary rows it put in flight (compat.row_states: the
promoting scan is the one that did). Then, on the same deferred keys and tier state, vLLM's
own scan alone (the class's method with vLLM's manager, no tap), ``--reps`` times: what
vLLM's code costs in each process, whatever kvscope's tap does. One arm per fresh process,
arms alternated; engine truth: the whole prompt restored from disk.

    python benchmarks/promoting_scan.py [--tokens 131072] [--runs 4] [--delay 16] [--reps 15]
                                        [--out F]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import scale_workload as w  # this directory
from scheduler_gc_diag import GCClock
from scheduler_overhead import OBSERVED, STOCK

ARMS = {"stock": STOCK, "observed": OBSERVED}


def child(arm: str, tokens: int, delay: int, reps: int) -> dict:
    from kvscope.connector import compat
    from kvscope.connector.compat.prefix_scan import SCAN_METHOD
    from kvscope.sim.cpu_engine import prompt

    s = w.sizes(tokens, 8000)
    with w.engine(ARMS[arm], s, 8192, delay) as e:
        gc.collect()  # the engine's startup heap, frozen as vLLM's EngineCore freezes it
        gc.freeze()
        target = prompt(1, s.tokens)
        first = e.generate(target, w.OUT, max_steps=10_000)
        e.drain(max_steps=10_000)
        for i, n in enumerate(s.flood):
            e.generate(prompt(100 + i, n), w.OUT, max_steps=10_000)
            e.drain(max_steps=10_000)
        cs = e.connector.connector_scheduler
        manager = getattr(cs.manager, "_inner", cs.manager)  # vLLM's, under kvscope's proxy
        primary = manager.primary_tier
        collections = GCClock()
        gc.callbacks.append(collections)
        scans: list[dict] = []
        same: list[float] = []
        outer = getattr(cs, SCAN_METHOD)
        vllm_scan = type(cs).__dict__[SCAN_METHOD]

        def timed(keys, *rest):
            if len(scans) == 5:  # a deferred scan's keys and state: vLLM's scan alone
                saved, cs.manager = cs.manager, manager
                try:
                    for _ in range(reps):
                        t0 = time.thread_time()
                        vllm_scan(cs, keys, *rest)
                        same.append(time.thread_time() - t0)
                finally:
                    cs.manager = saved
            flight0, (n0, s0) = compat.row_states(primary)[2], collections.totals()
            t0 = time.thread_time()
            try:
                return outer(keys, *rest)
            finally:
                cpu = time.thread_time() - t0
                n1, s1 = collections.totals()
                scans.append({"cpu_ms": round(cpu * 1e3, 3), "collections": sum(n1) - sum(n0),
                              "gc_ms": round((s1 - s0) * 1e3, 3),
                              "put_in_flight": compat.row_states(primary)[2] - flight0})

        rid = e.add_request(target, w.OUT)
        in_primary, on_disk = w.held_keys(e, rid)
        setattr(cs, SCAN_METHOD, timed)
        try:
            e.run_until_done([rid], max_steps=10_000)
        finally:
            setattr(cs, SCAN_METHOD, outer)
            gc.callbacks.remove(collections)
        again = e.finished[rid]
    promoting = max(range(len(scans)), key=lambda i: scans[i]["put_in_flight"])
    return {"arm": arm, "tokens": tokens, "keys": s.keys, "rows": s.rows, "delay": delay,
            "promoting_index": promoting, "promoting": scans[promoting],
            "later_median_ms": statistics.median(x["cpu_ms"] for x in scans[promoting + 1:-1]),
            "vllm_scan_alone_median_ms": round(statistics.median(same) * 1e3, 3),
            "scans": scans, "primary_keys_before": in_primary, "disk_keys_before": on_disk,
            "restored_tokens": again.num_external_tokens,
            "expected_tokens": w.expected_restore(on_disk),
            "same_output": again.output == first.output, "loadavg": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--runs", type=int, default=4, help="processes per arm, alternated")
    ap.add_argument("--delay", type=int, default=16)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out")
    ap.add_argument("--child", choices=sorted(ARMS), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.tokens, a.delay, a.reps)))
        return
    runs = []
    for i in range(a.runs):
        for arm in (("stock", "observed") if i % 2 == 0 else ("observed", "stock")):
            p = subprocess.run([sys.executable, __file__, "--child", arm, "--tokens",
                                str(a.tokens), "--delay", str(a.delay), "--reps", str(a.reps)],
                               capture_output=True, text=True, check=True)
            run = json.loads(p.stdout.strip().splitlines()[-1])
            assert run["primary_keys_before"] == 0 and run["disk_keys_before"] == run["keys"]
            assert run["restored_tokens"] == run["expected_tokens"] and run["same_output"], run
            runs.append(run)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(run) + "\n")
    med = {arm: {k: statistics.median(f(r) for r in runs if r["arm"] == arm) for k, f in (
        ("promoting_ms", lambda r: r["promoting"]["cpu_ms"]),
        ("promoting_collections", lambda r: r["promoting"]["collections"]),
        ("promoting_gc_ms", lambda r: r["promoting"]["gc_ms"]),
        ("later_ms", lambda r: r["later_median_ms"]),
        ("vllm_scan_alone_ms", lambda r: r["vllm_scan_alone_median_ms"]))} for arm in ARMS}
    summary = {"summary": med, "runs_per_arm": a.runs, "tokens": a.tokens}
    print(json.dumps(summary))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
