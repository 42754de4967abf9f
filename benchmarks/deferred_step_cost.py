"""A step of a long restore's wait, stock vs observed, in one process, on vLLM's scheduler on CPU.

While a long restore's promotion is in flight, vLLM re-scans the request every step and
defers it: ~80 such steps in a 131k-token restore on the H200, ~120 at 400k. This holds two
engines of the same geometry in one process, one with vLLM's ``OffloadingConnector``, one with
``ObservedOffloadingConnector``, each in that state (a ``--keys``-chunk prompt asked, evicted
by a second one of the same length, asked again; its promotions never complete:
``promotion_delay_steps`` past the run), and times their steps in alternating blocks (this
thread's CPU clock), so load on the machine falls on both arms alike. kvscope's aggregator
thread is left running as in service (it judges each deferred round off this thread).
``--first`` says which engine is built first: where each engine's objects lie in memory is
the process's, and differs between processes by more than kvscope's cost at 400k.

Engine truth per engine: the re-ask scheduled no token in any timed step (still deferred) and
its promoted rows were still being written when the timing ended.

    python benchmarks/deferred_step_cost.py --keys 8192 --steps 400 --out benchmarks/results/deferred_step_cost.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import replace

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

ARMS = ("OffloadingConnector", "ObservedOffloadingConnector")


def t975(df: int) -> float:
    """Student's t, two-sided 95 % (Cornish-Fisher from the normal: 2.093 at 19, as tables)."""
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def config(keys: int, connector: str):
    from kvscope.sim.cpu_engine import EngineConfig

    return replace(EngineConfig(rows=keys + keys // 10, num_gpu_blocks=keys + 200,
                                max_num_batched_tokens=4096, max_num_seqs=4,
                                max_model_len=keys * 16 + 64, promotion_delay_steps=10**7,
                                connector=connector), tiering=True, kv_groups=1)


def prompts_for(keys: int) -> list[list[int]]:
    """Two prompts of ``keys`` 16-token chunks, the same for a given ``keys``."""
    r = random.Random(keys)
    return [[r.randrange(1, 30_000) for _ in range(keys * 16)] for _ in range(2)]


def timed_steps(e, n: int) -> list[float]:
    """``n`` steps of ``e``, each on this thread's CPU clock (seconds)."""
    spent = []
    for _ in range(n):
        t0 = time.thread_time()
        e.step()
        spent.append(time.thread_time() - t0)
    return spent


def held(e, prompts: list[list[int]]) -> str:
    """Prompt 0 asked, evicted by prompt 1, asked again: deferred from then on."""
    e.generate(prompts[0], 2, max_steps=10_000)
    e.generate(prompts[1], 2, max_steps=10_000)
    e.drain(max_steps=10_000)
    rid = e.add_request(prompts[0], 2)
    for _ in range(3):  # the fs tier's existence checks, then the promoting scan
        e.step()
    return rid


def still_deferred(e, rid: str) -> bool:
    """Engine truth: the re-ask computed nothing and is not finished."""
    req = e.scheduler.requests.get(rid)
    return req is not None and req.num_computed_tokens == 0 and rid not in e.finished


def run(keys: int, steps: int, block: int, first: str = "stock") -> dict:
    from kvscope.connector import compat
    from kvscope.sim.cpu_engine import CPUEngine

    prompts = prompts_for(keys)
    times: dict[str, list[float]] = {a: [] for a in ARMS}
    truth: dict[str, dict] = {}
    built = ARMS if first == "stock" else ARMS[::-1]
    with CPUEngine(config(keys, built[0])) as e0, CPUEngine(config(keys, built[1])) as e1:
        engines = dict(zip(built, (e0, e1)))
        rids = {a: held(e, prompts) for a, e in engines.items()}
        for b in range(steps // block):
            for arm in (ARMS if b % 2 == 0 else ARMS[::-1]):
                times[arm].extend(timed_steps(engines[arm], block))
        for arm, e in engines.items():
            manager = e.connector.connector_scheduler.manager
            _, _, in_flight = compat.row_states(compat.primary_tier(manager))
            truth[arm] = {"deferred": still_deferred(e, rids[arm]),
                          "rows_being_written": in_flight}
    med = {a: statistics.median(v) * 1e6 for a, v in times.items()}
    # per block pair (one block of each arm, adjacent in time): observed's median step less
    # stock's, and the t interval of their mean
    diffs = [(statistics.median(times[ARMS[1]][i:i + block])
              - statistics.median(times[ARMS[0]][i:i + block])) * 1e6
             for i in range(0, len(times[ARMS[0]]), block)]
    mean = statistics.fmean(diffs)
    half = t975(len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    return {"keys": keys, "tokens": keys * 16, "built_first": first,
            "steps_per_arm": len(times[ARMS[0]]),
            "block": block, "step_us": {a: round(v, 1) for a, v in med.items()},
            "observed_minus_stock_us": round(med[ARMS[1]] - med[ARMS[0]], 1),
            "block_pairs": len(diffs),
            "block_diff_us_mean_ci95": [round(mean, 1), round(mean - half, 1),
                                        round(mean + half, 1)],
            "step_us_quartiles": {a: [round(q * 1e6, 1) for q in statistics.quantiles(v, n=4)]
                                  for a, v in times.items()},
            "engine_truth": truth}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--first", choices=("stock", "observed"), default="stock",
                    help="which engine is built (and its prompts asked) first")
    ap.add_argument("--out")
    a = ap.parse_args()
    head = header()
    res = run(a.keys, a.steps, a.block, a.first)
    res["load"] = os.getloadavg()[0]
    emit(head, res, a.out)
    return 0


def header() -> dict:
    """What a result line is stamped with (command, commit, vLLM, CPUs, start time)."""
    from scale_overhead import _header  # this directory

    return _header(sys.argv[1:])


def emit(head: dict, res: dict, out: str | None) -> None:
    """One JSON line, ``head`` then ``res``, printed and appended to ``out``."""
    line = json.dumps({**head, **res})
    print(line)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
