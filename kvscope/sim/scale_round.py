"""One round of kvscope at a long prompt with tiering, on vLLM's real scheduler on CPU: a
stock and an observed engine, fresh, stepped in lockstep (scale_pair.Pair) through three
phases, each ending with its stores drained: ask the long prompt, flood it out of the GPU
blocks and the primary tier, ask it again (restored from disk; each promotion in flight
``delay`` steps, a disk slower than a forward, so the re-ask's lookup round repeats over the
whole prompt). Sizes and engine truth: scale_workload.py.

Per phase (ask, flood, restore; whole = all three): ``ratio``, observed / stock thread CPU
inside Scheduler.schedule + update_from_output, and ``added_s`` (observed - stock);
``..._without_gc``: less the collections that ran inside each engine's calls (a full one,
~0.5 s over both engines' heap, lands in whichever engine triggers it); ``kvscope_s``: CPU of
kvscope's threads plus the synchronous refresh of what the phase left in the journal;
``keys``: keys the prefix scans looked up (None where kvscope taps the scan) and the costs
per key; ``journal_peak``. A round also carries kvscope_telemetry_errors_total and the
re-ask's engine truth (keys before it, tokens restored vs expected, same output).
"""

from __future__ import annotations

import os
import statistics

from kvscope.sim import scale_workload as w
from kvscope.sim.lockstep import OBSERVED, STOCK
from kvscope.sim.scale_pair import Pair

PHASES = ("ask", "flood", "restore")


def _phases(pair: Pair, s: w.Sizes) -> tuple[dict, dict]:
    """The three phases on ``pair``; (cost per phase, engine truth of the re-ask)."""
    from kvscope.sim.cpu_engine import prompt

    target = prompt(1, s.tokens)
    cost, truth, first = {}, {}, []
    cost["ask"] = pair.measure(lambda: first.append(pair.ask([target])))
    cost["flood"] = pair.measure(
        lambda: [pair.ask([prompt(100 + i, n)]) for i, n in enumerate(s.flood)])
    again = [[e.add_request(target, w.OUT)] for e in pair.engines]
    held = [w.held_keys(e, r[0]) for e, r in zip(pair.engines, again)]
    cost["restore"] = pair.measure(lambda: pair.step(again))
    done = [e.finished[r[0]] for e, r in zip(pair.engines, again)]
    before = [e.finished[r[0]] for e, r in zip(pair.engines, first[0])]
    expected = [w.expected_restore(d) for _, d in held]
    truth = {"primary_keys_before": [p for p, _ in held], "disk_keys_before": [d for _, d in held],
             "restored_tokens": [d.num_external_tokens for d in done],
             "expected_tokens": expected,
             "same_output": [d.output == b.output for d, b in zip(done, before)]}
    truth["restore_ok"] = all(p == 0 and d == s.keys for p, d in held) and \
        truth["restored_tokens"] == expected and all(truth["same_output"])
    return cost, truth


def _derived(c: dict) -> dict:
    stock_s, obs_s = c["scheduler_s"]
    kv = c["kvscope_threads_s"] + c["final_refresh_s"]
    keys = c["keys"][0]  # the stock engine's: vLLM's scan untapped (scale_workload.KeyCount)
    # each engine's timed calls less the collections that ran inside them: a full one
    # (~0.5 s here, the heap of both engines) lands in whichever engine triggers it
    (stock_gc, obs_gc) = c["gc_s"]
    added_nogc = (obs_s - obs_gc) - (stock_s - stock_gc)
    return {**c, "ratio": round(obs_s / stock_s, 4), "added_s": round(obs_s - stock_s, 4),
            "ratio_without_gc": round((obs_s - obs_gc) / (stock_s - stock_gc), 4),
            "added_s_without_gc": round(added_nogc, 4),
            "kvscope_s": round(kv, 4),
            "added_us_per_key": round(1e6 * (obs_s - stock_s) / keys, 3) if keys else None,
            "added_us_per_key_without_gc": round(1e6 * added_nogc / keys, 3) if keys else None,
            "kvscope_us_per_key": round(1e6 * kv / keys, 3) if keys else None}


def run_round(s: w.Sizes, batch: int, delay: int = 0) -> dict:
    load0 = os.getloadavg()
    with w.engine(STOCK, s, batch, delay) as stock, w.engine(OBSERVED, s, batch, delay) as obs:
        fs = w.fs_type(obs.fs_root)
        if fs in ("tmpfs", "ramfs"):
            raise SystemExit(f"the fs tier's root {obs.fs_root} is on {fs}, not a disk: "
                             "point TMPDIR at a disk")
        pair = Pair([stock, obs])
        try:
            cost, truth = _phases(pair, s)
        finally:
            pair.close()
        errors = w.telemetry_errors(obs)
    whole = {k: [sum(cost[p][k][i] for p in PHASES) for i in range(2)]
             for k in ("scheduler_s", "gc_s", "steps")}
    whole["keys"] = [None if None in ks else sum(ks)
                     for ks in ([cost[p]["keys"][i] for p in PHASES] for i in range(2))]
    whole.update({k: sum(cost[p][k] for p in PHASES) for k in (
        "kvscope_threads_s", "gc_kvscope_threads_s", "final_refresh_s", "wall_s")})
    whole["journal_peak"] = max(cost[p]["journal_peak"] for p in PHASES)
    phases = {p: _derived(c) for p, c in [*cost.items(), ("whole", whole)]}
    return {"tokens": s.tokens, "keys": s.keys, "rows": s.rows, "gpu_blocks": s.gpu_blocks,
            "flood_prompts": list(s.flood), "promotion_delay_steps": delay, "fs_type": fs,
            "phases": phases, **truth,
            "telemetry_errors": errors, "telemetry_errors_total": sum(errors.values()),
            "loadavg_start": [round(x, 2) for x in load0],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()]}


def summary(rounds: list[dict]) -> dict:
    def med(phase: str, key: str):
        vals = [r["phases"][phase][key] for r in rounds]
        return None if None in vals else round(statistics.median(vals), 4)

    return {"summary": True, "tokens": rounds[0]["tokens"], "keys": rounds[0]["keys"],
            "rounds": len(rounds),
            **{f"{p}_{k}": med(p, k) for p in ("restore", "whole")
               for k in ("ratio", "ratio_without_gc", "added_s", "added_s_without_gc",
                         "kvscope_s", "added_us_per_key", "added_us_per_key_without_gc",
                         "kvscope_us_per_key")},
            "restore_keys": [r["phases"]["restore"]["keys"] for r in rounds],
            "journal_peak_max": max(r["phases"]["whole"]["journal_peak"] for r in rounds),
            "telemetry_errors_max": max(r["telemetry_errors_total"] for r in rounds),
            "restore_ok_all": all(r["restore_ok"] for r in rounds),
            "loadavg_1m": [r["loadavg_start"][0] for r in rounds]}
