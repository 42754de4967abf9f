"""End to end on a GPU: does every case's tell show on a real GPU, and what does kvscope cost
a plain serving workload there? vllm.LLM with ObservedOffloadingConnector (and the stock one),
the cases of kvscope.sim.gpu_e2e_cases, each in a fresh process; ``all`` runs the functional
cases, then the overhead pair (stock, observed) alternately ``--rounds`` times.

    python benchmarks/gpu_e2e.py case cpu-restore          # one case, JSON on stdout
    python benchmarks/gpu_e2e.py all --out benchmarks/results/gpu_e2e.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from kvscope.sim.gpu_e2e_cases import CASES, case_in_subprocess, run_case


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("case")
    c.add_argument("name", choices=sorted(CASES))
    a = sub.add_parser("all")
    a.add_argument("--out", default="gpu_e2e.json")
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--skip", nargs="*", default=[])
    args = p.parse_args()
    if args.cmd == "case":
        print(json.dumps(run_case(args.name), default=str), flush=True)
        return 0
    results = {}
    for name in ("cpu-restore", "disk-restore", "ceiling"):
        if name not in args.skip:
            results[name] = case_in_subprocess(name)
            print(json.dumps(results[name], default=str)[:2000], flush=True)
    runs: dict[str, list[dict]] = {"overhead-stock": [], "overhead-observed": []}
    for _ in range(args.rounds):  # alternate, so drift hits both alike
        for name in runs:
            runs[name].append(case_in_subprocess(name))
            print(json.dumps(runs[name][-1], default=str)[:600], flush=True)
    results["overhead_runs"] = runs
    try:
        tps = {n: statistics.median(r["workload_tokens_per_s"] for r in rs)
               for n, rs in runs.items()}
        reask = {n: statistics.median(r["reask_s"] for r in rs) for n, rs in runs.items()}
        results["overhead"] = {
            "tokens_per_s_median": tps, "reask_s_median": reask,
            "tokens_per_s_ratio_observed_over_stock":
                round(tps["overhead-observed"] / tps["overhead-stock"], 4),
            "restore_latency_ratio_observed_over_stock":
                round(reask["overhead-observed"] / reask["overhead-stock"], 4)}
    except (KeyError, TypeError, ZeroDivisionError) as exc:
        results["overhead"] = {"error": repr(exc)}
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(json.dumps(results["overhead"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
