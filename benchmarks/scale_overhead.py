"""kvscope at 32k-131k-token prompts with tiering: scheduler step time, observed vs stock.

    python benchmarks/scale_overhead.py [--lengths 32768 65536 131072] [--rounds 3]
        [--min-rows 8000] [--batch 8192] [--promotion-delay 16] [--out F.jsonl]
    python benchmarks/scale_overhead.py --profile PREFIX [--lengths 131072]

Per prefix length, on vLLM's real scheduler on CPU (kvscope.sim.cpu_engine) with a
TieringOffloadingSpec + fs tier on disk (scale_workload.py: sizes and engine truth): ask
the long prompt, flood it out of the GPU blocks and the primary tier, ask it again
(restored from disk; each promotion in flight ``--promotion-delay`` steps, a disk slower
than a forward, so the re-ask's lookup round repeats over the whole prompt). A round is
one stock and one observed engine, fresh, stepped in lockstep (scale_pair.Pair: step by
step, rotating which goes first, so both see the same machine at each moment), phase by
phase, each phase ending with its stores drained. Per phase (ask, flood, restore; whole =
all three):

* ``ratio``: observed / stock thread CPU inside Scheduler.schedule + update_from_output
  (scheduler_overhead's step-time ratio), and ``added_s``, the scheduler thread's CPU
  kvscope added (observed - stock); ``..._without_gc``: less the collections that ran
  inside each engine's calls (``collections``: per engine index or thread, generation): a
  full one (~0.5 s, both engines' heap) lands in whichever engine triggers it;
* ``kvscope_s``: CPU of kvscope's threads (aggregator, tier probe, digests: thread_cpu.py,
  the kernel's per-thread accounting; ``kvscope_threads_by_name``) plus the synchronous
  refresh that applies what the phase left in the journal (engine thread, outside the
  scheduler's calls);
* ``keys``: keys the prefix scans looked up (scale_workload.KeyCount; stock, observed: None
  where kvscope taps the scan), and per key of the stock engine's: ``added_us_per_key``
  (``_without_gc``), ``kvscope_us_per_key``;
* ``journal_peak``: the most journal items waiting after any observed step.

A round's line also has kvscope_telemetry_errors_total (per ``where``), engine truth of the
re-ask (keys in the primary tier and on disk before it, tokens restored from disk vs
expected, same output as the first ask), and the machine's load average (2 shared cores).
The last line per length: medians over rounds. ``--profile PREFIX``: one observed engine
alone per length, cProfile (thread CPU clock) of its scheduler calls and of its aggregator
thread's refreshes over all three phases, as text: PREFIX_<tokens>_engine.txt and
PREFIX_<tokens>_aggregator.txt. Results: benchmarks/results/scale_overhead_*.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import scale_workload as w  # this directory
from scale_pair import Pair
from scheduler_overhead import (
    OBSERVED,
    STOCK,
    _profile_aggregator,
    _profile_scheduler_calls,
    _write_profile,
    _write_stats,
)

PHASES = ("ask", "flood", "restore")
# kvscope's modules in the aggregator profile's cumulative listing
AGG_OURS = "scheduler_side|aggregator|round_verdicts|coverage|request_states|step_gauges|" \
           "recorder|lookup_rounds|tier_taps|vllm_stats|round_spans|integrity"


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


def profile(s: w.Sizes, batch: int, prefix: str, delay: int = 0) -> dict:
    """One observed engine alone: its scheduler calls' and aggregator thread's profiles."""
    tmp = tempfile.mkdtemp(prefix="scale-profile-")
    try:
        with w.engine(OBSERVED, s, batch, delay) as obs:
            _profile_scheduler_calls(obs.scheduler, "")
            agg = _profile_aggregator(obs)
            pair = Pair([obs])
            try:
                cost, truth = _phases(pair, s)
            finally:
                pair.close()
            _write_profile(obs.scheduler, os.path.join(tmp, "engine"))
            _write_stats(agg, os.path.join(tmp, "aggregator"), AGG_OURS)
            errors = w.telemetry_errors(obs)
        out = {}
        for part in ("engine", "aggregator"):
            out[part] = f"{prefix}_{s.tokens}_{part}.txt"
            shutil.move(os.path.join(tmp, part + ".txt"), out[part])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"profile": out, "tokens": s.tokens,
            "scheduler_s": {p: round(c["scheduler_s"][0], 4) for p, c in cost.items()},
            "keys": {p: c["keys"][0] for p, c in cost.items()},
            "restore_ok": truth["primary_keys_before"] == [0]
            and truth["restored_tokens"] == truth["expected_tokens"],
            "telemetry_errors": errors, "loadavg": [round(x, 2) for x in os.getloadavg()]}


def _header(argv: list[str]) -> dict:
    import vllm

    here = os.path.dirname(os.path.abspath(__file__))
    commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"command": " ".join(["python", sys.argv[0], *argv]),
            "cwd": os.path.relpath(os.getcwd(), os.path.dirname(here)), "commit": commit,
            "vllm": vllm.__version__, "cpus": os.cpu_count(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[32768, 65536, 131072])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-rows", type=int, default=8000, help="primary rows, at least")
    p.add_argument("--batch", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--promotion-delay", type=int, default=16, metavar="STEPS",
                   help="steps each promotion from disk stays in flight (a disk slower "
                        "than a forward: the re-ask's lookups repeat meanwhile)")
    p.add_argument("--out", help="append the JSON lines to this file too")
    p.add_argument("--profile", metavar="PREFIX",
                   help="profiles (text) to PREFIX_<tokens>_{engine,aggregator}.txt instead")
    a = p.parse_args(argv)
    out = open(a.out, "a") if a.out else None

    def emit(d: dict) -> None:
        line = json.dumps(d)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    emit(_header(argv))
    for tokens in a.lengths:
        s = w.sizes(tokens, a.min_rows)
        if a.profile:
            emit(profile(s, a.batch, a.profile, a.promotion_delay))
            continue
        rounds = []
        for _ in range(a.rounds):
            rounds.append(run_round(s, a.batch, a.promotion_delay))
            emit(rounds[-1])
        emit(summary(rounds))


if __name__ == "__main__":
    main()
