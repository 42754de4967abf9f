"""A deferred scan split, while a restore's reads race the engine thread, on CPU: vLLM's own
scan and kvscope's tap around it, kvscope switched on and off in one process (ABBA pairs).

Why: on the GPU (gpu_scale.py, runs T3-T5) each scan of a waiting restore took +1.8-3.4 %
of the engine thread's CPU with kvscope on, where kvscope's work per such scan is a few
O(1) steps (the scan tap's counted path). With no reads racing, a deferred step costs
kvscope nothing measurable (deferred_step_cost.py). This splits the extra: a clock on
vLLM's scan method on its class, put before the engine is built, runs in both arms (stock
calls it, kvscope's tap calls the method it found), and a clock on the connector
scheduler's own attribute (the tap when on), as gpu_scale.py's.

``--threads quiet`` stops kvscope's periodic threads for the whole timed part, so in both
arms alike (the tier probe closed, the aggregator's wake-ups a day apart): a benchmark's
switch, not a setting.

Per iteration (restore_convoy.py's engine and ``--between restore`` schedule: prompts 0,
1 and 2 re-asked in turn, each evicted by the others' restores, the fs tier's read
threads racing the steps): per deferred scan (the promoting one, the longest, left out)
the CPU of the tapped scan, of vLLM's scan, and their difference. Engine truth per
re-ask: the tokens vLLM loaded and the output, equal to the first ask's.

    python benchmarks/deferred_scan_split.py --tokens 32768 --pairs 40 --threads running --out benchmarks/results/deferred_scan_split.jsonl
    python benchmarks/deferred_scan_split.py --tokens 32768 --pairs 40 --threads quiet --out benchmarks/results/deferred_scan_split.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from call_clock import CallClock
from gpu_scale_summary import per_deferred_scan
from kvscope_switch import KvscopeSwitch
from pair_stats import abba, paired_diffs, pairs_of
from reask_schedule import first_asks, iteration
from restore_convoy import BLOCK, OUT, engine_config, evict, settle

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

A_DAY_S = 86_400.0


def quiet_threads(switch: KvscopeSwitch) -> float:
    """kvscope's periodic threads stopped: the tier probe closed, the aggregator's next
    wake-up after this one a day away (it reads its interval at each). Returns the
    aggregator's interval before."""
    observer = switch.observer
    observer.probe.close()
    before, observer.agg.interval_s = observer.agg.interval_s, A_DAY_S
    return before


FIELDS = {name: (lambda i, n=name: i[n])
          for name in ("scan_us", "vllm_scan_us", "tap_us", "s")}


def run(tokens: int, pairs: int, warmup: int, threads: str) -> dict:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
        OffloadingConnectorScheduler,
    )

    from kvscope.connector.compat import SCAN_METHOD
    from kvscope.sim.cpu_engine import CPUEngine
    from kvscope.sim.cpu_model import prompt

    cfg = engine_config(tokens)
    vllm_scan = CallClock().wrap(OffloadingConnectorScheduler, SCAN_METHOD)
    iters: list[dict] = []
    try:
        with CPUEngine(cfg) as e:
            switch = KvscopeSwitch(e.scheduler, [r.connector for r in e.ranks])
            scan = CallClock().wrap(switch.cs, SCAN_METHOD)
            switch.clocks.append(scan)
            first = {}
            for j in first_asks("restore"):
                settle(e, switch.manager)
                first[j] = e.generate(prompt(j, tokens), OUT, max_steps=10**6).output
            interval = quiet_threads(switch) if threads == "quiet" else None
            for k, on in enumerate(abba(warmup, pairs)):
                p, timed = iteration("restore", k)
                out = evict(e, switch, on, tokens, p)
                if out is not None:
                    first[p] = out
                s0, v0 = (scan.calls, scan.seconds), (vllm_scan.calls, vllm_scan.seconds)
                scan.longest = vllm_scan.longest = 0.0
                t0 = time.perf_counter()
                again = e.generate(prompt(timed, tokens), OUT, max_steps=10**6)
                s = time.perf_counter() - t0
                tapped = 1e6 * per_deferred_scan(scan.seconds - s0[1], scan.longest,
                                                 scan.calls - s0[0])
                own = 1e6 * per_deferred_scan(vllm_scan.seconds - v0[1], vllm_scan.longest,
                                              vllm_scan.calls - v0[0])
                it = {"k": k, "on": on, "prompt": timed, "s": round(s, 4),
                      "scans": scan.calls - s0[0], "scan_us": round(tapped, 2),
                      "vllm_scan_us": round(own, 2), "tap_us": round(tapped - own, 2),
                      "loaded": again.num_external_tokens,
                      "same_output": again.output == first[timed]}
                print(json.dumps(it), flush=True)
                if k >= warmup:
                    iters.append(it)
            if interval is not None:  # the journal drained by the aggregator again
                switch.observer.agg.interval_s = interval
            settle(e, switch.manager)
            switch.set(True)
    finally:
        vllm_scan.unwrap()
    return {"tokens": tokens, "keys": tokens // BLOCK, "threads": threads, "cmd": sys.argv,
            "cpus": os.cpu_count(), "iters": iters,
            "checks": {"loaded": sorted({i["loaded"] for i in iters}),
                       "same_output": all(i["same_output"] for i in iters)},
            "paired": paired_diffs(pairs_of(iters), FIELDS)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", choices=("running", "quiet"), default="running",
                    help="kvscope's periodic threads left running, or stopped for the timed "
                         "part")
    ap.add_argument("--out", help="a JSON-lines file the run is appended to")
    a = ap.parse_args()
    res = run(a.tokens, a.pairs, a.warmup, a.threads)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(res) + "\n")
    print(json.dumps({k: res[k] for k in ("threads", "checks", "paired")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
