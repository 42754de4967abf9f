"""vLLM 0.26's store after finish on one GPU: does the stock engine die, does kvscope's live?

    python benchmarks/store_after_finish_gpu.py --out benchmarks/results/store_after_finish_h200.json

The deterministic way in (``kvscope.sim.store_after_finish.drive_last_token``, on the CPU
harness every run): with ``offload_prompt_only`` false, a request whose last generated token
fills a chunk has that chunk's store prepared the step after it finished, when vLLM 0.26 has
already deleted its tiering state: ``TieringOffloadingManager.prepare_store`` raises
``KeyError``. Here with ``vllm.LLM`` on the GPU (the 4-layer Llama of ``gpu_oracle.py``, dummy
weights, tiering with an fs tier): the stock connector, and kvscope's with
``contain_vllm_faults`` on (its default) and off, each in its own process. Then the engine is
asked to go on: a flood evicting the prompt from the GPU, and the prompt again (restored from
the offload tiers). Engine truth per request: output against the first ask's, tokens loaded
from the connector; whether vLLM raised, and what.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BLOCK = 16
PROMPT_TOKENS = 6 * BLOCK
MAX_TOKENS = BLOCK  # 96 + 16 tokens: the last generated one fills chunk 7
ROWS = 64
GPU_BLOCKS = 64


def engine_run(args) -> dict:
    from concurrent_long_reasks import recorded

    return recorded(_engine, args, {"connector": args.connector, "contain": args.contain})


def _engine(args, rec: dict) -> None:
    import random

    from vllm import LLM
    from vllm.config import KVTransferConfig

    from kvscope.sim.gpu_oracle_driver import ROW_BYTES, Driver, make_model

    d = tempfile.mkdtemp(prefix="kvscope-saf-model-")
    make_model(d, 1, 4096)
    fs = tempfile.mkdtemp(prefix=f"saf-{args.connector}-", dir=args.fs_root)
    observed = args.connector == "kvscope"
    extra = {"cpu_bytes_to_use": ROWS * ROW_BYTES[1], "block_size": BLOCK,
             "offload_prompt_only": False, "spec_name": "TieringOffloadingSpec",
             "secondary_tiers": [{"type": "fs", "root_dir": fs, "n_read_threads": 2,
                                  "n_write_threads": 2}]}
    if observed:
        extra["kvscope"] = {"contain_vllm_faults": args.contain}
    ktc = KVTransferConfig(
        kv_connector="ObservedOffloadingConnector" if observed else "OffloadingConnector",
        kv_connector_module_path="kvscope.connector" if observed else None,
        kv_role="kv_both", kv_load_failure_policy="recompute", kv_connector_extra_config=extra)
    llm = LLM(model=d, tokenizer=d, dtype="bfloat16", enforce_eager=True, block_size=BLOCK,
              num_gpu_blocks_override=GPU_BLOCKS, max_model_len=4096,
              max_num_batched_tokens=256, gpu_memory_utilization=0.1,
              kv_transfer_config=ktc, enable_prefix_caching=True, max_num_seqs=8,
              load_format="dummy", seed=0)
    import vllm

    rec["vllm_version"] = vllm.__version__
    drv = Driver(llm)
    rng = random.Random(1)
    target = [rng.randrange(3, 1000) for _ in range(PROMPT_TOKENS)]
    rec["phase"] = "ask"
    first = drv.run([target], MAX_TOKENS, 200)[0]
    rec["first"] = {"finished": first["finished"], "tokens": len(first["tokens"])}
    rec["phase"] = "steps after it finished"
    drv.idle()  # the step that prepares the finished request's last store
    rec["phase"] = "flood"
    flood = [rng.randrange(3, 1000) for _ in range(40 * BLOCK)]
    drv.run([flood], 2, 200)
    drv.idle()
    rec["phase"] = "again"
    again = drv.run([target], MAX_TOKENS, 200)[0]
    drv.idle()
    rec["again"] = {"finished": again["finished"], "restored": again["restored"],
                    "same_output": again["tokens"] == first["tokens"]}
    rec["phase"] = "done"
    if observed:
        from kvscope.exporters import signals as S

        r = drv.sched.connector.kvscope_recorder
        rec["faults_contained"] = r.value(S.VLLM_FAULTS_CONTAINED,
                                          (S.VllmFault.STORE_AFTER_FINISH.value,))
        rec["telemetry_errors"] = sum(r.value(S.TELEMETRY_ERRORS, (w.value,))
                                      for w in S.ErrorSite)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="all", choices=("all", "engine"))
    ap.add_argument("--connector", default="kvscope", choices=("kvscope", "stock"))
    ap.add_argument("--contain", type=lambda v: v == "on", default=True)
    ap.add_argument("--fs-root", default=os.path.join(os.getcwd(), ".gpu-fs"))
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.mode == "engine":
        engine_run(args)
        return 0
    os.makedirs(args.fs_root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="kvscope-saf-")
    procs = []
    for connector, contain in (("stock", "on"), ("kvscope", "on"), ("kvscope", "off")):
        out = os.path.join(tmp, f"{connector}-{contain}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "engine", "--connector", connector,
               "--contain", contain, "--fs-root", args.fs_root, "--out", out]
        procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                       stderr=open(out + ".log", "w")), out))
    engines = []
    for p, out in procs:
        p.wait(timeout=400)
        with open(out) as f:
            engines.append(json.load(f))
        print(json.dumps(engines[-1])[:700], flush=True)
    doc = {"command": "python benchmarks/store_after_finish_gpu.py " + " ".join(sys.argv[1:]),
           "prompt_tokens": PROMPT_TOKENS, "max_tokens": MAX_TOKENS, "rows": ROWS,
           "engines": engines}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
