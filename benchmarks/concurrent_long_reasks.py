"""Four concurrent long re-asks on one GPU: does the engine live, restore, and read idle after?

    python benchmarks/concurrent_long_reasks.py --out benchmarks/results/concurrent_long_reasks_h100.json

The geometry an operator hit (vLLM 0.26, one GPU, ``vllm.LLM`` in-process, the 4-layer Llama
of ``gpu_oracle.py`` with dummy weights, 16-token blocks, ``max_num_batched_tokens`` 8,192,
tiering with an fs tier): four prompts of 64,000 tokens asked one by one, five floods of the
same length evicting them from the GPU, then the four re-asked at once. Each engine runs in
its own process (a vLLM exception ends it), ``--parallel`` at once:

* the stock ``OffloadingConnector`` and kvscope's connector at ``--rows`` primary rows of
  32 KiB each (default 12,512 and its neighbours): did vLLM 0.26's ``KeyError`` in
  ``TieringOffloadingManager.prepare_store`` end the engine, and what did each request get;
* kvscope at rows where the re-asks restore (default 22,060): ``--scrape-after`` seconds after
  the wave returned, kv-diagnose on kvscope's exporter beside vLLM's own queues (an engine
  whose queues are empty must read idle);
* ``--plan-window R``: kvscope at R rows (default 9,000: restores cut), ``kv-diagnose plan``
  on its exporter after the wave (target 99 %), then engines at the plan's rows, 10 % and
  20 % fewer: the plan must restore every re-ask whole, 10 % fewer must not (or the plan
  says why it cannot be that tight).

Engine truth per request: tokens vLLM loaded from the connector (``num_external_cached_tokens``),
its output against the first ask's, finished or not; after the wave, whether vLLM still holds
a request. kvscope's own counters are reported beside it, never as the judgement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

PROMPT_TOKENS = 64_000
PROMPTS = 4
FLOODS = 5
CHUNK = 16
STEP_TOKENS = 8192
GPU_BLOCKS = 20_000  # four 64k prompts at once (16,000 blocks) and room to decode
ASK_TOKENS = 4


def _prompt(seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(PROMPT_TOKENS)]


def recorded(engine, args, rec: dict) -> dict:
    """``engine(args, rec)`` in this process (vLLM's engine core in-process), ``rec`` written
    to ``args.out`` even when vLLM raises: what it raised is then the result."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    t0 = time.monotonic()
    try:
        engine(args, rec)
    except BaseException as exc:  # the engine died
        rec["died"] = {"type": type(exc).__name__, "message": str(exc)[:500],
                       "where": traceback.format_exc().splitlines()[-8:]}
    rec["seconds"] = round(time.monotonic() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(rec, f, indent=1)
    return rec


def engine_run(args) -> dict:
    """One engine in this process; the record is written even when vLLM raises."""
    return recorded(_engine, args, {"connector": args.connector, "rows": args.rows,
                                    "kvscope_options": json.loads(args.kvscope_options)})


def _engine(args, rec: dict) -> None:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    from kvscope.sim.gpu_oracle_driver import ROW_BYTES, Driver, free_port, make_model

    d = tempfile.mkdtemp(prefix="kvscope-reask-model-")
    max_len = PROMPT_TOKENS + 128
    make_model(d, 1, max_len)
    fs = tempfile.mkdtemp(prefix=f"reask-{args.connector}-{args.rows}-", dir=args.fs_root)
    port = free_port()
    observed = args.connector == "kvscope"
    extra = {"cpu_bytes_to_use": args.rows * ROW_BYTES[1], "block_size": CHUNK,
             "spec_name": "TieringOffloadingSpec",
             "secondary_tiers": [{"type": "fs", "root_dir": fs, "n_read_threads": 4,
                                  "n_write_threads": 4}]}
    if observed:
        extra["kvscope"] = {"exporter_port": port, **rec["kvscope_options"]}
    ktc = KVTransferConfig(
        kv_connector="ObservedOffloadingConnector" if observed else "OffloadingConnector",
        kv_connector_module_path="kvscope.connector" if observed else None,
        kv_role="kv_both", kv_load_failure_policy="recompute", kv_connector_extra_config=extra)
    llm = LLM(model=d, tokenizer=d, dtype="bfloat16", enforce_eager=True, block_size=CHUNK,
              num_gpu_blocks_override=GPU_BLOCKS, max_model_len=max_len,
              max_num_batched_tokens=STEP_TOKENS, gpu_memory_utilization=0.2,
              kv_transfer_config=ktc, enable_prefix_caching=True, max_num_seqs=8,
              load_format="dummy", seed=0)
    import vllm

    rec["vllm_version"] = vllm.__version__
    drv = Driver(llm)
    prompts = [_prompt(s) for s in range(1, PROMPTS + 1)]
    first = []
    rec["phase"] = "ask"
    for p in prompts:
        first.append(drv.run([p], ASK_TOKENS, 2000)[0]["tokens"])
        drv.idle()
    rec["phase"] = "flood"
    for s in range(100, 100 + FLOODS):
        drv.run([_prompt(s)], 1, 2000)
        drv.idle()
    rec["phase"] = "re-ask"
    t = time.monotonic()
    got = drv.run(prompts, ASK_TOKENS, 4000, abort=False)
    rec["reask_seconds"] = round(time.monotonic() - t, 2)
    rec["requests"] = [{"restored": g["restored"], "finished": g["finished"],
                        "same_output": g["tokens"] == f} for g, f in zip(got, first)]
    rec["phase"] = "after"
    sched = drv.sched
    rec["vllm_after_wave"] = {"has_requests": sched.has_requests(),
                              "waiting": len(sched.waiting), "running": len(sched.running)}
    if observed and args.scrape_after > 0:
        time.sleep(args.scrape_after)  # as an operator's kv-diagnose, the engine idle
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        from kvscope.diagnostics.sources.scrape import scrape_window
        from kvscope.diagnostics.verdict.diagnose import diagnose_raw
        from kvscope.exporters.prometheus import start_exporter

        url = start_exporter([sched.connector.kvscope_recorder,
                              get_kv_transfer_group().kvscope_recorder], 0).url
        report = diagnose_raw(scrape_window([url], 1.0))
        rec["kv_diagnose"] = {"verdicts": [f.id for f in report.verdicts],
                              "exit_code": report.exit_code}
        rec["vllm_at_scrape"] = {"has_requests": sched.has_requests(),
                                 "waiting": len(sched.waiting), "running": len(sched.running)}
    if observed and args.plan:
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        from kvscope.diagnostics.evidence.build import build_evidence
        from kvscope.diagnostics.plan.coverage import make_plan
        from kvscope.diagnostics.plan.format import plan_to_dict
        from kvscope.diagnostics.plan.inputs import read_inputs
        from kvscope.diagnostics.sources.scrape import scrape_window
        from kvscope.exporters.prometheus import start_exporter

        url = start_exporter([sched.connector.kvscope_recorder,
                              get_kv_transfer_group().kvscope_recorder], 0).url
        plan = make_plan(read_inputs(build_evidence(scrape_window([url], 0.5))), 0.99)
        doc = plan_to_dict(plan)
        rec["plan"] = {k: doc.get(k) for k in ("rows", "rows_per_restore", "concurrency",
                                               "reserve_rows", "predictions")}
    if observed:
        from kvscope.exporters import signals as S

        r = sched.connector.kvscope_recorder
        rec["kvscope"] = {
            "telemetry_errors": sum(r.value(S.TELEMETRY_ERRORS, (w.value,))
                                    for w in S.ErrorSite),
            "requests": {st.value: r.value(S.REQUESTS, (st.value,)) for st in S.RequestState},
            "requests_in_flight": r.value(S.REQUESTS_IN_FLIGHT)}
        rec["kvscope"]["faults_contained"] = r.value(
            S.VLLM_FAULTS_CONTAINED, (S.VllmFault.STORE_AFTER_FINISH.value,))
    aborted = [r for r in drv.out if not drv.out[r]["finished"]]
    drv.abort(aborted)


def _spawn(args, connector: str, rows: int, options: str, out: str,
           scrape_after: float, plan: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "engine", "--connector", connector,
           "--rows", str(rows), "--kvscope-options", options, "--out", out,
           "--fs-root", args.fs_root, "--scrape-after", str(scrape_after)]
    if plan:
        cmd.append("--plan")
    log = open(out + ".log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def run_all(args) -> dict:
    os.makedirs(args.fs_root, exist_ok=True)
    work = [("kvscope", r, args.kvscope_options, 0.0, True) for r in args.plan_window]
    work += [(c, r, args.kvscope_options, 0.0, False) for r in args.rows for c in args.connectors]
    work += [("kvscope", r, args.kvscope_options, args.scrape_after, False)
             for r in args.idle_rows]
    tmp = tempfile.mkdtemp(prefix="kvscope-reasks-")
    results, running, deadline = [], [], time.monotonic() + args.deadline_s
    while work or running:
        while work and len(running) < args.parallel:
            c, r, o, s, plan = work.pop(0)
            out = os.path.join(tmp, f"{c}-{r}.json")
            running.append((_spawn(args, c, r, o, out, s, plan), out))
        p, out = running.pop(0)
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
        try:
            with open(out) as f:
                results.append(json.load(f))
        except (OSError, ValueError):
            with open(out + ".log") as f:
                tail = f.read()[-1500:]
            results.append({"out": out, "no_record": True, "exit": p.returncode, "log": tail})
        planned = (results[-1].get("plan") or {}).get("rows")
        if planned:  # the plan, 10 % and 20 % fewer rows, next
            work[:0] = [("kvscope", int(planned * f), args.kvscope_options, 0.0, False)
                        for f in (1.0, 0.9, 0.8)]
        print(json.dumps(results[-1])[:600], flush=True)
    doc = {"command": "python benchmarks/concurrent_long_reasks.py " + " ".join(sys.argv[1:]),
           "prompt_tokens": PROMPT_TOKENS, "prompts": PROMPTS, "floods": FLOODS,
           "step_tokens": STEP_TOKENS, "gpu_blocks": GPU_BLOCKS, "engines": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="all", choices=("all", "engine"))
    ap.add_argument("--connector", default="kvscope", choices=("kvscope", "stock"))
    ap.add_argument("--connectors", nargs="+", default=["stock", "kvscope"])
    ap.add_argument("--rows", type=int, nargs="+", default=[12_512])
    ap.add_argument("--idle-rows", type=int, nargs="*", default=[22_060])
    ap.add_argument("--plan-window", type=int, nargs="*", default=[9_000])
    ap.add_argument("--plan", action="store_true", help="engine mode: kv-diagnose plan after")
    ap.add_argument("--kvscope-options", default="{}", help="JSON: kvscope's extra options")
    ap.add_argument("--scrape-after", type=float, default=1.5)
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--deadline-s", type=float, default=560)
    ap.add_argument("--fs-root", default=os.path.join(os.getcwd(), ".gpu-fs"))
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.mode == "engine":
        args.rows = args.rows[0]
        engine_run(args)
        return 0
    run_all(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
