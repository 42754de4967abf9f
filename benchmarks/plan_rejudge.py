"""Recorded ``plan_verify.py`` results judged again by the current coverage model.

    python benchmarks/plan_rejudge.py benchmarks/results/plan_verify_*.json \\
        --out benchmarks/results/plan_rejudge.json

Each result keeps the plan its window gave (``k``, ``C``, losses, KV groups) and the engine
truth of every re-ask (tokens held, tokens restored, whether it ended). This recomputes the
measured coverage over the re-asks that ended (``plan_workload.truth_totals``) and the
model's prediction at each checked size (``planner.coverage_at``), beside what the run
recorded when it was made. The plan itself is not recomputed: the rows run are the rows run.
A run made before a model change is in-sample for that change; the table says which model
each run was made under (its recorded ``predicted``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def rejudge(doc: dict, max_error: float) -> dict:
    from kvscope.sim.plan_workload import judge_size, truth_totals

    plan, inputs = doc["plan"], doc["plan"]["inputs"]
    other = (inputs.get("other_loss") or {}).get("value") or 0.0
    groups = int((inputs.get("kv_groups") or {}).get("value") or 1)
    out = {}
    for label, run in doc["runs"].items():
        truth = truth_totals(run["waves"])
        s = judge_size({"rows": run["rows"], **truth}, plan["rows_per_restore"],
                       plan["concurrency"], other, groups)
        out[label] = {**s, "restores": truth["restores"], "whole": truth["restores_whole"],
                      "within": s["error"] <= max_error,
                      "recorded_predicted": doc["sizes"][label]["predicted"],
                      "recorded_error": doc["sizes"][label]["error"]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--max-error", type=float, default=0.05)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    table = {}
    for path in sorted(args.results):
        with open(path) as f:
            doc = json.load(f)
        if "runs" not in doc or "sizes" not in doc:
            continue
        name = os.path.basename(path)
        table[name] = {"device": doc.get("device"), "concurrency": doc["plan"]["concurrency"],
                       "sizes": rejudge(doc, args.max_error)}
        for label, s in table[name]["sizes"].items():
            print(f"{name:38} {label:12} {s['rows']:>6} rows  {s['whole']:>3}/{s['restores']:<3} "
                  f"measured {s['measured']:.4f}  predicted {s['predicted']:.4f} "
                  f"(recorded {s['recorded_predicted']:.4f})  error {100 * s['error']:.1f}  "
                  f"{'ok' if s['within'] else 'MISS'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:])),
                       "max_error": args.max_error, "results": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
