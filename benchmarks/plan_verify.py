"""``kv-diagnose plan`` against vLLM's scheduler: does the planned row count reach the target?

    python benchmarks/plan_verify.py                      # CPU, ~2 minutes
    python benchmarks/plan_verify.py --device cuda --out benchmarks/results/plan_verify_h200.json
    python benchmarks/plan_verify.py rejudge benchmarks/results/plan_verify_*.json \
        --out benchmarks/results/plan_rejudge.json   # recorded runs, the current model
    python benchmarks/plan_verify.py sweep --sweep-rows 700 737 --concurrency 6 ... --out R.json

The workload (``kvscope.sim.plan_workload.Workload``): ``--concurrency`` prompts of
``--prompt-tokens`` tokens asked one by one (stored, cascaded to the fs tier), then
``--waves`` times: a flood that evicts them from the GPU blocks and the primary tier, and
every prompt re-asked at once, each restoring its prefix from disk through the primary
tier's rows. Three engines:

1. **window**: ``--window-rows`` primary rows (default: half of what every restore at once
   needs: the concurrency form of the capacity ceiling). kvscope's exporter is scraped after
   the last wave, and ``kv-diagnose plan``'s parser, model and formatter turn that window into
   a row count for ``--target`` coverage (default 99 %) and predictions;
2. **plan**: the planned rows; 3. **plan - 10 %**: 10 % fewer rows (on the GPU also
   ``--fewer``'s other shares, 20 % fewer by default).

Coverage measured = engine truth, never kvscope's counters: tokens vLLM loaded from the
connector for each re-ask (its ``num_external_cached_tokens``) / tokens the tiers held for
the re-asked prefix right before it (read from the tiers themselves,
``oracle_truth.held_tokens``), summed over every re-ask that ended (``truth_totals``: one
still deferred when the step budget ran out is counted apart, ``unfinished``). Checked: the plan's coverage
reaches the target, 10 % fewer rows miss it, and the prediction is within
``--max-error`` (5 points) of the measured coverage at both sizes.

CPU: vLLM's real scheduler and tiering manager, CPU copies for the GPU's DMA
(``kvscope.sim.cpu_engine``), the fs tier's I/O settled every step. ``--device cuda``: each
engine is ``vllm.LLM`` in its own process (a tiny Llama with dummy weights built on the spot
and the step driver, both from ``kvscope.sim.gpu_oracle_driver``; ``TieringOffloadingSpec`` with an
fs tier under ``--fs-root``), the fs tier's threads racing the steps as on a server; the
last two engines run at once on the one GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# A re-ask's restores wait on the fs tier's reads, and the steps while they wait are cheap:
# three 128,000-token re-asks outran their step budget and were aborted while waiting,
# which vLLM 0.26 does not survive (an aborted never-scheduled request's store job,
# vLLM #49118). The wave steps past its budget for this long before it gives up.
REASK_PATIENCE_S = 120.0
DEFAULT_OUT = {"cpu": "benchmarks/results/plan_verify_cpu.json",
               "cuda": "benchmarks/results/plan_verify_h200.json"}


def workload(args):
    from kvscope.sim.plan_workload import Workload

    return Workload(concurrency=args.concurrency, prompt_tokens=args.prompt_tokens,
                    waves=args.waves, step_tokens=args.step_tokens, seed=args.seed,
                    promotion_delay_steps=args.promotion_delay_steps, kv_groups=args.kv_groups,
                    sliding_window=args.sliding_window)


# ---- CPU ------------------------------------------------------------------------------------
def run_cpu(args) -> dict:
    from kvscope.sim.plan_workload import verify_cpu

    doc = verify_cpu(workload(args), args.target, args.window_rows or None, args.max_error,
                     log=lambda msg: print(msg, flush=True))
    return _stamp(args, doc)


def run_sweep(args) -> dict:
    """CPU, no plan: the workload's engine at each of ``--sweep-rows``, engine truth at each
    (how close a plan is to the fewest rows that restore every re-ask whole)."""
    from kvscope.sim.plan_workload import run_cpu

    work, sizes = workload(args), []
    for rows in args.sweep_rows:
        run = run_cpu(work, rows).as_dict()
        sizes.append({k: run[k] for k in ("rows", "restores", "restores_whole", "unfinished",
                                          "coverage", "seconds")})
        print(f"{rows} rows: {run['restores_whole']}/{run['restores']} whole, "
              f"{run['unfinished']} unfinished", flush=True)
    return _stamp(args, {"workload": work.as_dict(), "sweep": sizes})


def _stamp(args, doc: dict) -> dict:
    import vllm

    return {"command": "python benchmarks/plan_verify.py " + " ".join(sys.argv[1:]),
            "device": args.device, "vllm_version": vllm.__version__, **doc}


# ---- GPU ------------------------------------------------------------------------------------
def gpu_engine_run(args) -> dict:
    """One engine (this process): the workload at ``--rows``; with ``--window``, kvscope's
    exporter scraped after the last wave, written as a bundle beside ``--out``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler in this process
    from types import SimpleNamespace

    from vllm import LLM
    from vllm.config import KVTransferConfig

    from kvscope.connector import compat
    from kvscope.sim.gpu_oracle_driver import (
        ROW_BYTES,
        Driver,
        free_port,
        make_model,
        window_last,
    )
    from kvscope.sim.oracle_truth import held_tokens, request_keys, tier_lookup
    from kvscope.sim.plan_workload import ASK_TOKENS, CHUNK, truth_totals

    work = workload(args)
    t0 = time.monotonic()
    d = tempfile.mkdtemp(prefix="kvscope-plan-model-")
    max_len = max(4096, work.prompt_tokens + 64)
    make_model(d, work.kv_groups, max_len)
    fs = tempfile.mkdtemp(prefix=f"plan-{args.rows}-", dir=args.fs_root)
    port = free_port()
    ktc = KVTransferConfig(
        kv_connector="ObservedOffloadingConnector", kv_connector_module_path="kvscope.connector",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={
            "cpu_bytes_to_use": args.rows * ROW_BYTES[work.kv_groups], "block_size": CHUNK,
            "spec_name": "TieringOffloadingSpec",
            "secondary_tiers": [{"type": "fs", "root_dir": fs, "n_read_threads": 4,
                                 "n_write_threads": 4}],
            "kvscope": {"exporter_port": port}})
    llm = LLM(model=d, tokenizer=d, dtype="bfloat16", enforce_eager=True, block_size=CHUNK,
              num_gpu_blocks_override=work.gpu_blocks, max_model_len=max_len,
              max_num_batched_tokens=work.step_tokens,
              gpu_memory_utilization=args.gpu_memory_utilization,
              kv_transfer_config=ktc, enable_prefix_caching=True,
              max_num_seqs=max(8, work.concurrency), load_format="dummy", seed=0,
              **({"async_scheduling": False} if args.sync_scheduling else {}))
    up = time.monotonic() - t0
    drv = Driver(llm)
    trace = None
    if args.trace:
        from kvscope.sim.lookup_trace import LookupTrace

        trace = LookupTrace(drv.sched)
    shim = SimpleNamespace(connector=drv.sched.connector,
                           _block_hasher=drv.core.request_block_hasher,
                           cfg=SimpleNamespace(kv_groups=work.kv_groups))
    holds = tier_lookup(shim)
    order = window_last(compat.kv_group_kinds(drv.sched.kv_cache_config))
    budget = work.step_budget()
    prompts = work.prompts()
    for p in prompts:
        drv.run([p], ASK_TOKENS, budget)
        drv.idle()
    keys = [[k[i] for i in order] for k in (request_keys(shim, p) for p in prompts)]
    waves = []
    for w in range(work.waves):
        for f in work.flood_prompts(w):
            drv.run([f], 1, budget)
        drv.idle()
        held = [held_tokens(k, holds, len(p), CHUNK, work.window_chunks)
                for k, p in zip(keys, prompts, strict=True)]
        t_ask = time.monotonic()
        got = drv.run(prompts, ASK_TOKENS, budget, patience_s=REASK_PATIENCE_S,
                      added=trace.follow if trace is not None else None)
        ended = [g["finished"] for g in got]
        waves.append({"held": held, "restored": [g["restored"] for g in got],
                      "finished": all(ended), "unfinished": ended.count(False), "ended": ended,
                      "steps": drv.last_steps, "seconds": round(time.monotonic() - t_ask, 1)})
        if trace is not None:
            waves[-1]["trace"] = trace.stop()
        drv.idle()
    out = {"rows": args.rows, "row_bytes": ROW_BYTES[work.kv_groups], "waves": waves, "engine_up_s": round(up, 1)}
    if args.window:
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        from kvscope.diagnostics.sources.bundle import write_bundle
        from kvscope.diagnostics.sources.scrape import scrape_window
        from kvscope.exporters.prometheus import start_exporter

        url = start_exporter([drv.sched.connector.kvscope_recorder,
                              get_kv_transfer_group().kvscope_recorder], 0).url
        out["bundle"] = args.out + ".kvb"
        write_bundle(scrape_window([url], 0.5), out["bundle"], force=True)
    out.update(truth_totals(waves),
               seconds=round(time.monotonic() - t0, 1))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return out


def _spawn(args, rows: int, out: str, window: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "engine", "--rows", str(rows), "--out", out,
           "--concurrency", str(args.concurrency), "--prompt-tokens", str(args.prompt_tokens),
           "--waves", str(args.waves), "--step-tokens", str(args.step_tokens),
           "--seed", str(args.seed), "--fs-root", args.fs_root, "--kv-groups", str(args.kv_groups),
           "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if args.sliding_window:
        cmd += ["--sliding-window", str(args.sliding_window)]
    if window:
        cmd.append("--window")
    if args.trace:
        cmd.append("--trace")
    if args.sync_scheduling:
        cmd.append("--sync-scheduling")
    log = open(out + ".log", "w")  # noqa: SIM115  the child's; closed with the process
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _wait(procs: dict[str, tuple[subprocess.Popen, str]], deadline: float) -> dict[str, dict]:
    got = {}
    for label, (proc, out) in procs.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode != 0 or not os.path.exists(out):
            with open(out + ".log") as f:
                tail = f.read()[-3000:]
            raise SystemExit(f"{label} engine failed (rc={proc.returncode}):\n{tail}")
        with open(out) as f:
            got[label] = json.load(f)
    return got


def run_gpu(args) -> dict:
    from kvscope.diagnostics.plan.format import format_plan, plan_to_dict
    from kvscope.diagnostics.sources.bundle import read_bundle
    from kvscope.sim.plan_workload import check_sizes, judge, plan_window

    work = workload(args)
    window_rows = args.window_rows or work.concurrency * work.chunks // 2
    deadline = time.monotonic() + args.deadline_s
    tmp = tempfile.mkdtemp(prefix="kvscope-plan-verify-")
    os.makedirs(args.fs_root, exist_ok=True)
    win_out = os.path.join(tmp, "window.json")
    win = _wait({"window": (_spawn(args, window_rows, win_out, window=True), win_out)},
                deadline)["window"]
    print(f"window: {window_rows} rows, measured coverage {win['coverage']:.3f}", flush=True)
    plan = plan_window(read_bundle(win["bundle"]), args.target)
    procs = {}
    for label, rows in check_sizes(plan, tuple(args.fewer)).items():
        out = os.path.join(tmp, f"{label.replace(' ', '').replace('%', 'pct')}.json")
        procs[label] = (_spawn(args, rows, out), out)
    runs = _wait(procs, deadline)
    for label, run in runs.items():
        print(f"{label}: {run['rows']} rows, measured coverage {run['coverage']:.3f}", flush=True)
    sizes, checks = judge(plan, runs, args.target, args.max_error)
    return _stamp(args, {"workload": work.as_dict(), "target": args.target,
                         "max_error": args.max_error, "window": win,
                         "plan": plan_to_dict(plan), "plan_text": format_plan(plan),
                         "sizes": sizes, "runs": runs, "checks": checks,
                         "passed": all(checks.values())})


# ---- recorded results judged again -----------------------------------------------------
def rejudge(doc: dict, max_error: float) -> dict:
    from kvscope.diagnostics.plan.coverage import partial_reach
    from kvscope.sim.plan_workload import judge_size, truth_totals

    plan, inputs = doc["plan"], doc["plan"]["inputs"]
    other = (inputs.get("other_loss") or {}).get("value") or 0.0
    groups = int((inputs.get("kv_groups") or {}).get("value") or 1)
    k = plan["rows_per_restore"]
    # recorded before the plan kept it: groups of equal rows (no sliding-window cap)
    reach = plan.get("partial_reach") or partial_reach([k // groups] * groups)
    out = {}
    for label, run in doc["runs"].items():
        truth = truth_totals(run["waves"])
        s = judge_size({"rows": run["rows"], **truth}, k, plan["concurrency"], other, reach,
                       bool(plan.get("partial_cut")), int(plan.get("window_store_rows") or 0))
        out[label] = {**s, "restores": truth["restores"], "whole": truth["restores_whole"],
                      "within": s["error"] <= max_error,
                      "recorded_predicted": doc["sizes"][label]["predicted"],
                      "recorded_error": doc["sizes"][label]["error"]}
    return out



def rejudge_files(paths: list[str], max_error: float, out: str | None) -> int:
    """Recorded results judged again by the current coverage model: the measured coverage
    over the re-asks that ended (``plan_workload.truth_totals``) and the model's prediction
    at each checked size (``plan.coverage.coverage_at``), beside what the run recorded when made.
    The plan is not recomputed (the rows run are the rows run); a run made before a model
    change is in-sample for that change (its recorded ``predicted`` says under which)."""
    table = {}
    for path in sorted(paths):
        with open(path) as f:
            doc = json.load(f)
        if "runs" not in doc or "sizes" not in doc:
            continue
        name = os.path.basename(path)
        table[name] = {"device": doc.get("device"), "concurrency": doc["plan"]["concurrency"],
                       "sizes": rejudge(doc, max_error)}
        for label, s in table[name]["sizes"].items():
            print(f"{name:38} {label:12} {s['rows']:>6} rows  {s['whole']:>3}/{s['restores']:<3} "
                  f"measured {s['measured']:.4f}  predicted {s['predicted']:.4f} "
                  f"(recorded {s['recorded_predicted']:.4f})  error {100 * s['error']:.1f}  "
                  f"{'ok' if s['within'] else 'MISS'}")
    if out:
        with open(out, "w") as f:
            json.dump({"command": " ".join(["plan_verify.py", *sys.argv[1:]]),
                       "max_error": max_error, "results": table}, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="verify",
                    choices=("verify", "engine", "rejudge", "sweep"))
    ap.add_argument("results", nargs="*", help="rejudge: recorded plan_verify results")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--waves", type=int, default=1)
    ap.add_argument("--step-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-groups", type=int, default=1, choices=(1, 2),
                    help="KV groups: on CPU full attention (a restore pins a row per chunk of "
                         "each) unless --sliding-window; on cuda 2 is a Gemma2-style model, "
                         "sliding window and full attention alternating")
    ap.add_argument("--sliding-window", type=int, default=None, metavar="TOKENS",
                    help="with --kv-groups 2: the last group attends to this many tokens (a "
                         "hybrid model; on cuda always the Gemma2-style model's window)")
    ap.add_argument("--promotion-delay-steps", type=int, default=0,
                    help="CPU: promotions complete this many steps late (the GPU's timing)")
    ap.add_argument("--window-rows", type=int, default=0,
                    help="rows of the window's engine (default: half of all restores at once)")
    ap.add_argument("--fewer", type=float, nargs="+", default=[0.10, 0.20],
                    help="cuda: also run the engine at these shares fewer rows than the plan "
                         "(0.10 is the tightness check)")
    ap.add_argument("--sync-scheduling", action="store_true",
                    help="cuda: async_scheduling off (every engine vLLM #52170 killed "
                         "here, long prompts on 0.26, ran with it on)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.1,
                    help="cuda: each engine's share of the GPU (three run at once; lower it to "
                         "check several geometries side by side)")
    ap.add_argument("--target", type=float, default=0.99)
    ap.add_argument("--max-error", type=float, default=0.05)
    ap.add_argument("--fs-root", default=os.path.join(os.getcwd(), ".gpu-fs"))
    ap.add_argument("--deadline-s", type=float, default=540)
    ap.add_argument("--rows", type=int, help="engine mode: primary rows")
    ap.add_argument("--sweep-rows", type=int, nargs="+", default=[],
                    help="sweep mode (CPU): primary rows of each engine run")
    ap.add_argument("--window", action="store_true", help="engine mode: scrape kvscope after")
    ap.add_argument("--trace", action="store_true",
                    help="each engine's waves: lookups, statuses and primary rows by step "
                         "(kvscope.sim.lookup_trace), in the wave's 'trace'")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if args.mode == "engine":
        gpu_engine_run(args)
        return 0
    if args.mode == "rejudge":
        return rejudge_files(args.results, args.max_error, args.out)
    if args.sliding_window is not None and args.kv_groups != 2:
        ap.error("--sliding-window: the last of two KV groups attends to the window")
    if args.device == "cuda" and args.kv_groups == 2:
        from kvscope.sim.gpu_oracle_geometry import WINDOW_TOKENS

        if args.sliding_window not in (None, WINDOW_TOKENS):
            ap.error(f"--sliding-window: the GPU's two-group model (Gemma2-style) attends to "
                     f"{WINDOW_TOKENS} tokens")
        args.sliding_window = WINDOW_TOKENS
    if args.mode == "sweep":
        if args.device != "cpu" or not args.sweep_rows or not args.out:
            ap.error("sweep: CPU only, with --sweep-rows and --out")
        doc = run_sweep(args)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        return 0
    args.out = args.out or DEFAULT_OUT[args.device]
    doc = run_gpu(args) if args.device == "cuda" else run_cpu(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(doc["plan_text"])
    print(json.dumps({"sizes": doc["sizes"], "checks": doc["checks"], "passed": doc["passed"]},
                     indent=1))
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
