"""A deferred re-ask that never ends: which of its own chunks it lacks, step by step.

    .venv033/bin/python benchmarks/own_rows_probe.py --out benchmarks/results/own_rows_probe_v033.json

The CI plan check's workload at 10 % fewer rows than planned (``kvscope.sim.plan_workload``:
24 prompts of 1,024 tokens re-asked at once through 1,396 primary rows, vLLM's real scheduler
and tiering manager on the CPU harness). After the wave's step budget, for ``--steps`` more
steps: each unfinished re-ask's chunks (by index in its prefix) not ready in the primary tier,
and those of the promotion jobs in flight. On vLLM 0.33 the first re-ask is left deferred, and
its last chunks cycle: each step it promotes the ones it lacks and the allocation evicts
another of its own (``tests/connector/test_livelock_own_rows.py`` checks what kv-diagnose says
of it). On vLLM 0.26 every re-ask ends and there is nothing to probe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

ROWS = 1396


def probe(steps: int) -> dict:
    import vllm

    from kvscope.connector import compat
    from kvscope.sim.cpu_engine import CPUEngine
    from kvscope.sim.oracle_truth import request_keys
    from kvscope.sim.plan_workload import ASK_TOKENS, Workload, ask_each, flood

    work = Workload(concurrency=24, prompt_tokens=1024)
    engine = CPUEngine(work.engine_config(ROWS))
    try:
        ask_each(engine, work)
        flood(engine, work, 0)
        prompts = work.prompts()
        rids = [engine.add_request(p, ASK_TOKENS) for p in prompts]
        try:
            engine.run_until_done(rids, max_steps=work.step_budget())
        except TimeoutError:
            pass
        stuck = [i for i, r in enumerate(rids) if r not in engine.finished]
        manager = engine.connector.connector_scheduler.manager
        manager = getattr(manager, "_inner", manager)  # beneath kvscope's proxy
        keys = {i: request_keys(engine, prompts[i])[0] for i in stuck}
        rows = []
        for _ in range(steps if stuck else 0):
            row = {"step": engine.steps}
            for i, ks in keys.items():
                index = {k: c for c, k in enumerate(ks)}
                jobs = [[index.get(k, "other") for k in j.transfer_job.keys]
                        for j in getattr(manager, "_jobs", {}).values()
                        if getattr(j.transfer_job, "is_promotion", False)]
                row[str(i)] = {"missing": [c for c, k in enumerate(ks)
                                           if not compat.primary_holds(manager, k)],
                               "promotions_in_flight": jobs}
            rows.append(row)
            engine.step()
        return {"command": "python benchmarks/own_rows_probe.py " + " ".join(sys.argv[1:]),
                "vllm_version": vllm.__version__, "rows": ROWS, "workload": work.as_dict(),
                "steps_before": work.step_budget(), "unfinished": stuck,
                "chunks_per_reask": {str(i): len(ks) for i, ks in keys.items()},
                "probe": rows}
    finally:
        engine.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    doc = probe(args.steps)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps({k: doc[k] for k in ("vllm_version", "unfinished")}))
    for row in doc["probe"]:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
