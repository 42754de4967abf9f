"""What kvscope's cadence (``flush_interval_s``) buys on CPU: scheduler_overhead.py's
lockstep pairs per cadence, the cadences alternated run by run.

    python benchmarks/scheduler_overhead_cadence.py [--intervals 0.05 0.25 1.0]
        [--repeats 5] [--rounds 1] [--requests 1000] [--no-tiering]

Each repeat runs every interval once, in turn (a fresh process each:
``scheduler_overhead.py --flush-interval S``), so drift of a shared machine spreads over
all of them. One JSON line per run goes to ``--out``
(benchmarks/results/scheduler_overhead_cadence.jsonl): the run's last JSON line plus the
load average before and after, the CPU, the commit and the time; then one summary line
per interval (medians over runs of the per-pair ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def one_run(interval_s: float, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, os.path.join(HERE, "scheduler_overhead.py"),
           "--requests", str(args.requests), "--rounds", str(args.rounds),
           "--flush-interval", str(interval_s)] + (["--no-tiering"] if args.no_tiering else [])
    load_before = os.getloadavg()
    out = subprocess.run(cmd, cwd=HERE, text=True, capture_output=True, check=True,
                         timeout=args.timeout)
    last = json.loads(out.stdout.strip().splitlines()[-1])
    return {**last, "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "cpu": _cpu_model(), "nproc": os.cpu_count(), "commit": _commit(),
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--intervals", type=float, nargs="+", default=[0.05, 0.25, 1.0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="lockstep pairs per run")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--no-tiering", action="store_true")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=os.path.join(HERE, "results",
                                                 "scheduler_overhead_cadence.jsonl"))
    args = p.parse_args()
    runs: dict[float, list[dict]] = {s: [] for s in args.intervals}
    with open(args.out, "a") as f:
        for _ in range(args.repeats):
            for s in args.intervals:
                r = one_run(s, args)
                runs[s].append(r)
                f.write(json.dumps(r) + "\n")
                f.flush()
                print(json.dumps(r), flush=True)
        for s, rs in runs.items():
            summary = {
                "summary": True, "flush_interval_s": s, "tiering": not args.no_tiering,
                "requests": args.requests, "runs": len(rs),
                "lockstep_pairs": sum(len(r["pair_ratios"]) for r in rs),
                "cpu_ratio_with_kvscope_threads_median": round(statistics.median(
                    r["cpu_ratio_with_kvscope_threads"] for r in rs), 4),
                "step_time_ratio_observed_over_stock_median": round(statistics.median(
                    r["step_time_ratio_observed_over_stock"] for r in rs), 4),
                "cpu_ratios": [r["cpu_ratio_with_kvscope_threads"] for r in rs],
                "step_time_ratios": [r["step_time_ratio_observed_over_stock"] for r in rs],
                "kvscope_threads_s_median": round(statistics.median(
                    r["kvscope_threads_s_median"] for r in rs), 4),
                "loadavg_1m": [r["loadavg_before"][0] for r in rs],
                "cpu": rs[0]["cpu"], "nproc": rs[0]["nproc"], "commit": rs[0]["commit"]}
            f.write(json.dumps(summary) + "\n")
            print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
