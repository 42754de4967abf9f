"""The engine-truth oracle matrix: kv-diagnose's verdicts vs what the engine did.

    python benchmarks/oracle_matrix.py --seed 0 --count 220 --out benchmarks/results/oracle_matrix.json

Generates ``--count`` seeded CPU geometries (``kvscope.sim.oracle_geometry``; with
``--reported``, the GPU runs' geometries reproduced there: ``REPORTED``), runs each
on vLLM's real scheduler (the CPU harness), derives its truth class from the engine (``kvscope.sim.oracle_truth``), has kv-diagnose judge it
from a live scrape and from a recorded bundle, and writes the summary
(geometries, agreement, false_healthy, confusion) with one row per geometry.
Same seed, same geometries; the truth of a geometry can still differ between
runs where the fs tier's I/O threads race the steps (rare: tiers settle every step).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=220)
    ap.add_argument("--only", type=int, nargs="*", help="geometry indices to run (default: all)")
    ap.add_argument("--reported", action="store_true",
                    help="run the geometries reported from GPU runs (oracle_geometry.REPORTED)")
    ap.add_argument("--out", default="benchmarks/results/oracle_matrix.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    import vllm

    from kvscope.sim.oracle import run_geometry, summarize
    from kvscope.sim.oracle_geometry import REPORTED, generate

    geoms = list(REPORTED.values()) if args.reported else generate(args.seed, args.count)
    if args.only:
        geoms = [geoms[i] for i in args.only]
    rows, errors = [], []
    t0 = time.monotonic()
    for g in geoms:
        try:
            row = run_geometry(g)
        except Exception as e:  # a harness failure is reported, never silently dropped
            errors.append({"geometry": g.as_dict(), "error": f"{type(e).__name__}: {e}"})
            print(f"{g.name}: ERROR {type(e).__name__}: {e}", flush=True)
            continue
        rows.append(row)
        if "live" not in row:  # the engine itself failed: nothing to judge
            print(f"{g.name:48s} truth={row['truth']:16s} {row['why']}", flush=True)
            continue
        mark = "" if row["live"]["agree"] and row["bundle"]["agree"] else "   <-- disagrees"
        print(f"{g.name:48s} truth={row['truth']:16s} live={row['live']['top']:28s} "
              f"bundle={row['bundle']['top']:28s} {row['seconds']:5.1f}s{mark}", flush=True)
    doc = summarize(rows)
    doc.update({
        "seed": args.seed,
        "count": args.count,
        "errors": errors,
        "command": "python benchmarks/oracle_matrix.py " + " ".join(argv or sys.argv[1:]),
        "vllm_version": vllm.__version__,
        "python": platform.python_version(),
        "wall_seconds": round(time.monotonic() - t0, 1),
        "rows": rows,
    })
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    head = {k: doc[k] for k in ("geometries", "agreement", "agreement_live", "agreement_bundle",
                                "false_healthy", "false_alarm", "truth_counts")}
    print(json.dumps(head, indent=1))
    print(json.dumps(doc["confusion"], indent=1))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
