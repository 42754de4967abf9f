"""The engine-truth oracle on a GPU: kv-diagnose's verdicts vs what vLLM did, ~32 geometries.

    python benchmarks/gpu_oracle.py --seed 0 --out benchmarks/results/gpu_oracle.json

One device call (9 minutes): 8 engines (``vllm.LLM`` in-process, a tiny dummy-weight
model built on the spot: a Llama, or a Gemma2-style model for 2 KV groups, sliding
window + full attention), ``--parallel`` of them at once on the one GPU, each running
its phase's geometries one after another (``kvscope.sim.gpu_oracle_geometry``: rows, tokens per
step, prompts of 1k-32k tokens, 1-4 concurrent re-asks, the CPU tier alone or tiering
with the fs tier). Per geometry, as the CPU oracle (``kvscope.sim.oracle``): ask each
prompt, flood, take the per-key truth (which of the prompt's keys the tiers hold,
read from the tiers themselves: ``oracle_truth.tier_lookup``), re-ask the prompts
together, then the truth class from what vLLM served (``oracle_truth.classify``) and
kv-diagnose on the observed connector's exporter: live, and from a recorded bundle,
both over this geometry's window only (the engine's counters before it began are
the window's baseline). Writes ``geometries``, ``agreement``, ``false_healthy``,
``confusion`` (``oracle.summarize``) and a row per geometry, rewritten as rows come.

    python benchmarks/gpu_oracle.py phase --phase 3 --seed 0 --out rows.jsonl  # one engine
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from kvscope.sim import gpu_oracle_geometry as geo
from kvscope.sim.gpu_oracle_driver import (
    ROW_BYTES,
    Driver,
    free_port,
    make_model,
    phases_in_parallel,
    run_geometry,
    write,
)

# Every phase at once (one H200 holds 8 tiny engines: 10 % of its memory each); what
# has not ended by the deadline is stopped, its rows so far kept (one 9-minute call)
PARALLEL = 8
DEADLINE_S = 500
def run_phase(phase: geo.Phase, out_path: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler in this process
    from vllm import LLM
    from vllm.config import KVTransferConfig

    d = tempfile.mkdtemp(prefix="kvscope-gpu-oracle-")
    make_model(d, phase.kv_groups, phase.max_model_len)
    port = free_port()
    extra: dict = {"cpu_bytes_to_use": phase.rows * ROW_BYTES[phase.kv_groups],
                   "block_size": geo.BLOCK, "kvscope": {"exporter_port": port}}
    if phase.tiering:
        fs = os.path.join(os.getcwd(), ".gpu-fs", f"oracle-{phase.index}-{os.getpid()}")
        os.makedirs(fs, exist_ok=True)
        extra.update(spec_name="TieringOffloadingSpec", secondary_tiers=[
            {"type": "fs", "root_dir": fs, "n_read_threads": 4, "n_write_threads": 4}])
    ktc = KVTransferConfig(kv_connector="ObservedOffloadingConnector",
                           kv_connector_module_path="kvscope.connector", kv_role="kv_both",
                           kv_load_failure_policy="recompute", kv_connector_extra_config=extra)
    t0 = time.monotonic()
    llm = LLM(model=d, tokenizer=d, dtype="bfloat16", enforce_eager=True, block_size=geo.BLOCK,
              num_gpu_blocks_override=phase.num_gpu_blocks, max_model_len=phase.max_model_len,
              max_num_batched_tokens=phase.step_tokens, gpu_memory_utilization=0.1,
              kv_transfer_config=ktc, enable_prefix_caching=True, max_num_seqs=8,
              load_format="dummy", seed=0)
    up = round(time.monotonic() - t0, 1)
    drv = Driver(llm)
    # the scheduler's and rank 0's series on one endpoint (each role has a recorder of its
    # own, as kvscope.sim.oracle serves a CPU engine's): the per-rank checks need the rank's
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    from kvscope.exporters.prometheus import start_exporter

    url = start_exporter([drv.sched.connector.kvscope_recorder,
                          get_kv_transfer_group().kvscope_recorder], 0).url
    for g in phase.geometries:
        t = time.monotonic()
        try:
            row = run_geometry(drv, phase, g, url)
        except Exception as e:  # reported, never dropped; the next geometry starts clean
            import traceback

            row = {"error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()[-3000:]}
            drv.abort(list(drv.out))
            drv.idle()
        row.update(phase=phase.as_dict(), name=phase.geometry_name(g), engine_up_s=up,
                   seconds=round(time.monotonic() - t, 1))
        with open(out_path, "a") as f:
            f.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="all", choices=("all", "phase"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phase", type=int)
    ap.add_argument("--parallel", type=int, default=PARALLEL)
    ap.add_argument("--deadline-s", type=float, default=DEADLINE_S)
    ap.add_argument("--out", default="benchmarks/results/gpu_oracle.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    phases = geo.generate(args.seed)
    if args.mode == "phase":
        run_phase(phases[args.phase], args.out)
        return 0
    from kvscope.sim.oracle import summarize

    rows: list[dict] = []
    t0 = time.monotonic()

    def on_row(row: dict) -> None:
        rows.append(row)
        if "live" in row:
            mark = "" if row["live"]["agree"] and row["bundle"]["agree"] else "  <-- disagrees"
            print(f"{row['name']:52s} truth={row['truth']:16s} live={row['live']['top']:28s} "
                  f"bundle={row['bundle']['top']:28s}{mark}", flush=True)
        else:
            print(f"{row['name']:52s} ERROR {row.get('error')}", flush=True)
        write(rows, args, t0, summarize)

    status = phases_in_parallel(phases, args.seed, args.parallel, args.out, on_row,
                                args.deadline_s, os.path.abspath(__file__))
    doc = write(rows, args, t0, summarize, status)
    print(json.dumps({k: doc[k] for k in ("geometries", "agreement", "false_healthy",
                                          "false_alarm", "truth_counts", "confusion")}, indent=1))
    return 0 if doc["geometries"] and not doc["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
