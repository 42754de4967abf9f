"""Is the plan's CPU window repeatable on a loaded machine? ``test_plan_verify``'s window
(24 re-asks of 1,024 tokens at half the rows they need together) run again and again in one
process, with ``--load`` busy processes beside it, stock vLLM or kvscope: per run, which
re-asks vLLM restored whole (engine truth: tokens loaded >= tokens the tiers held).

    python benchmarks/plan_window_repeat.py --runs 4 --load 3 --connector OffloadingConnector --out ...
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys

from kvscope.sim.plan_workload import Workload, run_cpu


def _spin() -> None:
    while True:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--load", type=int, default=3, help="busy processes beside the engine")
    ap.add_argument("--connector", default="ObservedOffloadingConnector")
    ap.add_argument("--delay", type=int, default=0, help="promotion_delay_steps")
    ap.add_argument("--out")
    a = ap.parse_args()
    work = Workload(concurrency=24, prompt_tokens=1024, waves=1, promotion_delay_steps=a.delay)
    base = Workload.engine_config
    Workload.engine_config = lambda self, rows, **o: base(self, rows, connector=a.connector, **o)
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(a.load)]
    for p in spinners:
        p.start()
    lines = []
    try:
        for i in range(a.runs):
            w = run_cpu(work, work.concurrency * work.chunks // 2).waves[0]
            whole = "".join("1" if r >= h else "0" for r, h in zip(w.restored, w.held))
            lines.append({"run": i, "connector": a.connector, "load": a.load, "delay": a.delay,
                          "restores_whole": whole.count("1"), "whole": whole,
                          "cmd": sys.argv})
            print(json.dumps(lines[-1]), flush=True)
    finally:
        for p in spinners:
            p.terminate()
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
