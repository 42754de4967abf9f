"""What building the dicts of vLLM's offloading objects costs vLLM's own deferred step, on CPU.

From CPython 3.11 an object's attributes live inline until something asks for its
``__dict__``; ``vars(obj)`` builds it, and every attribute read of the object is slower from
then on. Until 2026-12-06 the within-process A/B's switch (``kvscope_switch.py``) read
``vars()`` of the connector scheduler, the primary tier and each secondary tier, so every
``gpu_scale.py`` and ``restore_convoy.py`` run so far ran *both* arms on those slower objects.
This measures the effect on stock vLLM: one engine with vLLM's ``OffloadingConnector`` holds
a re-asked prompt whose promotions never complete (``deferred_step_cost.py``); its steps are
timed (this thread's CPU clock, median), then the same again after ``vars()`` of those objects
(``--arm vars``) or of nothing (``--arm none``: the drift between the two halves).

    for a in vars none vars none; do python benchmarks/dict_built_cost.py --arm $a --out benchmarks/results/dict_built_cost.jsonl; done
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from deferred_step_cost import config, emit, header, held, prompts_for, still_deferred, timed_steps  # noqa: E402


def run(keys: int, steps: int, arm: str) -> dict:
    from kvscope.sim.cpu_engine import CPUEngine

    with CPUEngine(config(keys, "OffloadingConnector")) as e:
        rid = held(e, prompts_for(keys))

        def median_step_us() -> float:
            return statistics.median(timed_steps(e, steps)) * 1e6

        before = median_step_us()
        if arm == "vars":  # what the switch read: the connector scheduler and the tiers
            cs = e.connector.connector_scheduler
            for obj in (cs, cs.manager.primary_tier, *cs.manager.secondary_tiers):
                vars(obj)
        after = median_step_us()
        deferred = still_deferred(e, rid)
    return {"arm": arm, "keys": keys, "steps": steps, "step_us_before": round(before, 1),
            "step_us_after": round(after, 1), "after_over_before": round(after / before, 4),
            "engine_truth": {"deferred": deferred}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", choices=("vars", "none"), required=True)
    ap.add_argument("--keys", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out")
    a = ap.parse_args()
    emit(header(), run(a.keys, a.steps, a.arm), a.out)  # stamped before the run
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
