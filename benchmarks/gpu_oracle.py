"""The engine-truth oracle on a GPU: kv-diagnose's verdicts vs what vLLM did, ~32 geometries.

    python benchmarks/gpu_oracle.py --seed 0 --out benchmarks/results/gpu_oracle.json

One device call (9 minutes): 8 engines (``vllm.LLM`` in-process, a tiny dummy-weight
model built on the spot: a Llama, or a Gemma2-style model for 2 KV groups, sliding
window + full attention), ``--parallel`` of them at once on the one GPU, each running
its phase's geometries one after another (``gpu_oracle_geometry.py``: rows, tokens per
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
import subprocess
import sys
import tempfile
import time
import urllib.request
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_oracle_geometry as geo  # noqa: E402

VOCAB = 1021  # gpu_e2e's word-level tokenizer
# KV bytes of one 16-token block of one KV group, every layer of it (bf16): the Llama's
# 4 layers, or the Gemma2-style model's 2 layers per group; x 2 K/V, 2 KV heads, 64 dims
ROW_BYTES = {1: 4 * 2 * 2 * 64 * 16 * 2, 2: 2 * 2 * 2 * 64 * 16 * 2}
# Every phase at once (one H200 holds 8 tiny engines: 10 % of its memory each); what
# has not ended by the deadline is stopped, its rows so far kept (one 9-minute call)
PARALLEL = 8
DEADLINE_S = 500
SCRAPE_INTERVAL_S = 0.5
IDLE_STEPS = 50


def make_model(d: str, kv_groups: int, max_len: int) -> None:
    """Tokenizer (gpu_e2e's) and config.json; no weights (load_format=dummy)."""
    from gpu_e2e import make_model as tokenizer_and_llama
    from transformers import Gemma2Config, LlamaConfig

    tokenizer_and_llama(d)
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            os.remove(os.path.join(d, f))
    dims = dict(vocab_size=VOCAB + 3, hidden_size=256, intermediate_size=512,
                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=64, max_position_embeddings=max(max_len, 8192), bos_token_id=1,
                eos_token_id=2, torch_dtype="bfloat16")
    if kv_groups == 2:  # sliding-window and full-attention layers alternate: 2 KV groups
        Gemma2Config(sliding_window=geo.WINDOW_TOKENS, pad_token_id=0, **dims).save_pretrained(d)
    else:
        LlamaConfig(**dims).save_pretrained(d)


def _scrape(url: str) -> tuple[list, float]:
    from kvscope.diagnostics.scrape import parse_exposition

    t = time.time()
    with urllib.request.urlopen(url, timeout=10) as resp:
        return parse_exposition(resp.read().decode(), url, t), t


class Driver:
    """One engine: steps it (no ``generate``: a livelocked re-ask must not hang the run)
    and keeps each request's output, cached and restored tokens from the scheduler's
    outputs, as the CPU harness does (``engine_results``)."""

    def __init__(self, llm) -> None:
        self.llm, self.eng = llm, llm.llm_engine
        self.core = self.eng.engine_core.engine_core  # in-process (no multiprocessing)
        self.sched = self.core.scheduler
        self.out: dict[str, dict] = {}
        self.n = 0
        update = self.sched.update_from_output

        def collect(*a, **kw):
            got = update(*a, **kw)
            for eco in got.values():
                for o in eco.outputs:
                    rec = self._find(o.request_id)
                    if rec is None:
                        continue
                    rec["tokens"].extend(o.new_token_ids)
                    ps = getattr(o, "prefill_stats", None)
                    if ps is not None:
                        rec["cached"] = int(getattr(ps, "num_cached_tokens", 0) or 0)
                        rec["restored"] = int(getattr(ps, "num_external_cached_tokens", 0) or 0)
                    rec["finished"] = rec["finished"] or bool(o.finished)
            return got
        self.sched.update_from_output = collect

    def _find(self, internal: str) -> dict | None:
        rec = self.out.get(internal)
        if rec is None:  # vLLM 0.33 suffixes the ids it is given
            rec = self.out.get(internal.rsplit("-", 1)[0])
        return rec

    def run(self, prompts: list[list[int]], max_tokens: int, budget: int,
            abort: bool = True, added=None) -> list[dict]:
        """Ask ``prompts`` at once; step until they finish or ``budget`` steps pass
        (``abort``: then abort the rest; else they stay: :meth:`abort` later).
        ``added(ids)``: told the requests' ids, in order, before the first step."""
        from vllm import SamplingParams

        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        rids = []
        for ids in prompts:
            self.n += 1
            rid = f"kvo{self.n:06d}"
            self.out[rid] = {"tokens": [], "cached": 0, "restored": 0, "finished": False}
            self.eng.add_request(rid, {"prompt_token_ids": ids}, sp)
            rids.append(rid)
        if added is not None:
            added(rids)
        for _ in range(budget):
            if all(self.out[r]["finished"] for r in rids):
                break
            self.eng.step()
        got = [self.out[r] for r in rids]
        if abort:
            self.abort(rids)
        return got

    def abort(self, rids: list[str]) -> None:
        left = [r for r in rids if r in self.out and not self.out[r]["finished"]]
        if left:
            self.eng.abort_request(left)
        for r in rids:
            self.out.pop(r, None)

    def stepping(self):
        """Steps the engine on a thread while the window is judged (a livelocked engine
        keeps stepping, as vLLM does: the CPU oracle's background loop); a context."""
        import contextlib
        import threading

        @contextlib.contextmanager
        def loop():
            stop = threading.Event()

            def run() -> None:
                while not stop.wait(0.05):
                    if self.sched.has_requests():
                        self.eng.step()
            t = threading.Thread(target=run, name="kvscope-gpu-oracle", daemon=True)
            t.start()
            try:
                yield
            finally:
                stop.set()
                t.join(timeout=30)
        return loop()

    def idle_for(self, seconds: float) -> bool:
        """Step while work is pending, up to ``seconds``; True: still pending."""
        deadline = time.monotonic() + seconds
        while self.sched.has_requests() and time.monotonic() < deadline:
            self.eng.step()
            time.sleep(0.05)
        return self.sched.has_requests()

    def idle(self, steps: int = IDLE_STEPS) -> bool:
        """Step with nothing to run so transfers settle; True: work still pending."""
        for _ in range(steps):
            if not self.sched.has_requests():
                return False
            self.eng.step()
            time.sleep(0.01)
        return self.sched.has_requests()


def run_phase(phase: geo.Phase, out_path: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler in this process
    from vllm import LLM
    from vllm.config import KVTransferConfig

    d = tempfile.mkdtemp(prefix="kvscope-gpu-oracle-")
    make_model(d, phase.kv_groups, phase.max_model_len)
    port = _free_port()
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_geometry(drv: Driver, phase: geo.Phase, g: geo.Geometry, url: str) -> dict:
    """Ask, flood, per-key truth, re-ask together, truth class, kv-diagnose (this
    geometry's window, live and from a bundle)."""
    from kvscope.connector import compat
    from kvscope.diagnostics import diagnose_bundle
    from kvscope.diagnostics.bundle import write_bundle
    from kvscope.diagnostics.engine import diagnose_raw
    from kvscope.sim.oracle import THRESHOLDS, judgment
    from kvscope.sim.oracle_truth import (
        RequestTruth,
        classify,
        held_tokens,
        request_keys,
        restore_keys,
        tier_lookup,
    )

    kinds = compat.kv_group_kinds(drv.sched.kv_cache_config)
    # oracle_truth reads the last group as the sliding-window one: keys in that order
    order = sorted(range(len(kinds)), key=lambda i: kinds[i] == "sliding_window")
    window = geo.WINDOW_TOKENS // geo.BLOCK if "sliding_window" in kinds else None
    shim = SimpleNamespace(connector=drv.sched.connector, _block_hasher=drv.core.request_block_hasher,
                           cfg=SimpleNamespace(kv_groups=len(kinds) or 1))
    holds = tier_lookup(shim)
    rows = compat.rows_total(compat.primary_tier(shim.connector.connector_scheduler.manager))

    def keys_of(ids):
        k = request_keys(shim, ids)
        return [k[i] for i in order]

    budget = 4 * -(-g.concurrency * g.prompt_tokens // phase.step_tokens) + 8 * g.output_tokens + 200
    before, t0 = _scrape(url)
    prompts = g.prompts(VOCAB)
    keys = [keys_of(p) for p in prompts]
    first, stored, full = [], [], range(len(order) - (1 if window else 0))
    for p, k in zip(prompts, keys, strict=True):
        (r,) = drv.run([p], g.output_tokens, budget)
        first.append(r)
        drv.idle()
        # what the tiers hold of it right after its ask (with tiering nothing is dropped:
        # a full-attention key in no tier was never stored)
        stored.append((sum(holds(x) for grp in k for x in grp),
                       phase.tiering and not all(holds(x) for i in full for x in k[i])))
    for f in g.flood_prompts(VOCAB):
        drv.run([f], g.output_tokens, budget)
    drv.idle()
    reqs = []
    for p, k, (s, lost) in zip(prompts, keys, stored, strict=True):
        held = held_tokens(k, holds, len(p), geo.BLOCK, window)
        reqs.append(RequestTruth(held=held, need_keys=restore_keys(k, held, geo.BLOCK),
                                 stored_first=s, prompt_keys=sum(map(len, k)), lost_first=lost))
    again = drv.run(prompts, g.output_tokens, budget, abort=False)
    for req, a, f, k in zip(reqs, again, first, keys, strict=True):
        req.finished = a["finished"] and f["finished"]
        req.served, req.restored = a["cached"], a["restored"]
        req.same_output = a["tokens"] == f["tokens"]
        req.need_keys = restore_keys(k, req.held, geo.BLOCK, local=req.served - req.restored)
    # transfers still pending after idle steps and twice kv-diagnose's stuck-after time
    pending = all(r.finished for r in reqs) and drv.idle() and drv.idle_for(
        2 * THRESHOLDS.pending_after_s)
    with drv.stepping():  # unfinished re-asks (livelock) or pending work keep stepping
        mid, t1 = _scrape(url)
        time.sleep(SCRAPE_INTERVAL_S)
        end, t2 = _scrape(url)
    drv.abort(list(drv.out))
    drv.idle()
    raw = geo.window(before, t0, [(mid, t1), (end, t2)], url)
    truth, why = classify(reqs, rows, pending, kv_groups=len(kinds) or 1)
    live = diagnose_raw(raw, THRESHOLDS)
    with tempfile.TemporaryDirectory(prefix="kvscope-gpu-oracle-") as tmp:
        path = os.path.join(tmp, "geometry.kvb")
        write_bundle(raw, path)
        bundle = diagnose_bundle(path, thresholds=THRESHOLDS)
    return {"geometry": {**g.__dict__, "rows_actual": rows, "kv_group_kinds": kinds},
            "truth": truth, "why": why, "pending_at_end": pending,
            "requests": [{**r.__dict__, "need_keys": len(r.need_keys)} for r in reqs],
            "live": judgment(truth, live), "bundle": judgment(truth, bundle)}


def _phases_in_parallel(phases: list[geo.Phase], seed: int, parallel: int, out: str,
                        on_row, deadline_s: float) -> dict[str, dict]:
    """Each phase in its own process (vLLM's process-wide state), ``parallel`` at once,
    its rows in a file of its own; all stopped ``deadline_s`` after the start. Returns
    each phase's exit status, rows and log."""
    todo, running, status = list(phases), [], {}
    deadline = time.monotonic() + deadline_s
    while todo or running:
        if time.monotonic() > deadline:
            for p in todo:
                status[p.name] = {"rc": None, "rows": 0, "why": "not started by the deadline"}
            todo.clear()
        while todo and len(running) < parallel:
            p = todo.pop(0)
            rows_path, log_path = f"{out}.p{p.index}.jsonl", f"{out}.p{p.index}.log"
            for path in (rows_path, log_path):
                if os.path.exists(path):
                    os.remove(path)
            cmd = [sys.executable, os.path.abspath(__file__), "phase", "--phase", str(p.index),
                   "--seed", str(seed), "--out", rows_path]
            log = open(log_path, "w")  # noqa: SIM115  closed when the phase ends
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            running.append({"phase": p, "proc": proc, "log": log, "rows": rows_path,
                            "log_path": log_path, "seen": 0})
            print(f"[{time.strftime('%H:%M:%S')}] started {p.name}", flush=True)
        time.sleep(2)
        for r in list(running):
            r["seen"] = _read_rows(r["rows"], r["seen"], on_row)
            late = time.monotonic() > deadline
            if r["proc"].poll() is None and not late:
                continue
            if late and r["proc"].poll() is None:
                r["proc"].kill()
            r["proc"].wait()
            r["log"].close()
            r["seen"] = _read_rows(r["rows"], r["seen"], on_row)
            running.remove(r)
            p, rc = r["phase"], r["proc"].returncode
            status[p.name] = {"rc": rc, "rows": r["seen"], "log": r["log_path"],
                              "why": "stopped at the deadline" if late else ""}
            print(f"[{time.strftime('%H:%M:%S')}] {p.name} ended rc={rc}, {r['seen']} of "
                  f"{len(p.geometries)} geometries" + (" (deadline)" if late else ""), flush=True)
    return status


def _read_rows(path: str, seen: int, on_row) -> int:
    """Rows a phase appended since ``seen`` (whole lines only: it may be mid-write)."""
    if not os.path.exists(path):
        return seen
    with open(path) as f:
        lines = f.read().split("\n")[:-1]  # the part after the last newline is unfinished
    for line in lines[seen:]:
        on_row(json.loads(line))
    return len(lines)


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

    status = _phases_in_parallel(phases, args.seed, args.parallel, args.out, on_row,
                                 args.deadline_s)
    doc = write(rows, args, t0, summarize, status)
    print(json.dumps({k: doc[k] for k in ("geometries", "agreement", "false_healthy",
                                          "false_alarm", "truth_counts", "confusion")}, indent=1))
    return 0 if doc["geometries"] and not doc["errors"] else 1


def write(rows: list[dict], args, t0: float, summarize, phases: dict | None = None) -> dict:
    """The summary so far (partial until every phase has ended: ``phases`` None),
    rewritten each row."""
    import vllm

    doc = summarize([r for r in rows if "live" in r])
    doc.update(seed=args.seed, errors=[r for r in rows if "live" not in r],
               partial=phases is None, phases=phases or {},
               command="python benchmarks/gpu_oracle.py " + " ".join(sys.argv[1:]),
               vllm_version=vllm.__version__, wall_seconds=round(time.monotonic() - t0, 1),
               rows=rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, args.out)
    return doc


if __name__ == "__main__":
    sys.exit(main())
