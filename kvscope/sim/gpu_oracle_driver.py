"""The GPU oracle's engine driver: the tiny dummy-weight models it builds (a Llama, or a
Gemma2-style model for 2 KV groups: sliding window + full attention), a ``Driver`` that steps
an in-process ``vllm.LLM`` request by request, one geometry's run judged against engine truth
(``run_geometry``: the CPU oracle's truth classes and kv-diagnose live and from a bundle, over
the geometry's window only), and the summary file the rows are written to. Shared by the GPU
oracle, the plan check and the long re-ask benchmarks (benchmarks/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from types import SimpleNamespace

from kvscope.sim import gpu_oracle_geometry as geo

VOCAB = 1021  # gpu_e2e_cases' word-level tokenizer


# KV bytes of one 16-token block of one KV group, every layer of it (bf16): the Llama's
# 4 layers, or the Gemma2-style model's 2 layers per group; x 2 K/V, 2 KV heads, 64 dims
ROW_BYTES = {1: 4 * 2 * 2 * 64 * 16 * 2, 2: 2 * 2 * 2 * 64 * 16 * 2}


SCRAPE_INTERVAL_S = 0.5


IDLE_STEPS = 50


def make_model(d: str, kv_groups: int, max_len: int) -> None:
    """Tokenizer (gpu_e2e's) and config.json; no weights (load_format=dummy)."""
    from transformers import Gemma2Config, LlamaConfig

    from kvscope.sim.gpu_e2e_cases import make_model as tokenizer_and_llama


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


def window_last(kinds: list[str]) -> list[int]:
    """The KV groups' indexes with the sliding-window one last: the order
    ``oracle_truth.held_tokens`` reads a request's keys in (``kinds``:
    ``compat.kv_group_kinds``)."""
    return sorted(range(len(kinds)), key=lambda i: kinds[i] == "sliding_window")


def _scrape(url: str) -> tuple[list, float]:
    from kvscope.diagnostics.sources.scrape import parse_exposition


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
            abort: bool = True, added=None, patience_s: float = 0.0) -> list[dict]:
        """Ask ``prompts`` at once; step until they finish or ``budget`` steps pass, and
        ``patience_s`` seconds (``abort``: then abort the rest; else they stay:
        :meth:`abort` later). ``added(ids)``: told the requests' ids, in order, before the
        first step. ``last_steps``: the steps taken."""
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
        start, self.last_steps = time.monotonic(), 0
        while not all(self.out[r]["finished"] for r in rids):
            if self.last_steps >= budget and time.monotonic() - start >= patience_s:
                break
            self.eng.step()
            self.last_steps += 1
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


def free_port() -> int:
    import socket


    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_geometry(drv: Driver, phase: geo.Phase, g: geo.Geometry, url: str) -> dict:
    """Ask, flood, per-key truth, re-ask together, truth class, kv-diagnose (this
    geometry's window, live and from a bundle)."""
    from kvscope.connector import compat
    from kvscope.diagnostics import diagnose_bundle
    from kvscope.diagnostics.sources.bundle import write_bundle
    from kvscope.diagnostics.verdict.diagnose import diagnose_raw
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
    order = window_last(kinds)
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


def phases_in_parallel(phases: list[geo.Phase], seed: int, parallel: int, out: str,
                       on_row, deadline_s: float, script: str) -> dict[str, dict]:
    """Each phase in its own process (vLLM's process-wide state: ``python script phase
    --phase N --seed S --out ROWS``), ``parallel`` at once, its rows in a file of its own;
    all stopped ``deadline_s`` after the start. Returns each phase's exit status, rows and
    log."""
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
            cmd = [sys.executable, script, "phase", "--phase", str(p.index),
                   "--seed", str(seed), "--out", rows_path]
            log = open(log_path, "w")  # noqa: SIM115  closed when the phase ends
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            running.append({"phase": p, "proc": proc, "log": log, "rows": rows_path,
                            "log_path": log_path, "seen": 0})
            print(f"[{time.strftime('%H:%M:%S')}] started {p.name}", flush=True)
        time.sleep(2)
        for r in list(running):
            r["seen"] = read_rows(r["rows"], r["seen"], on_row)
            late = time.monotonic() > deadline
            if r["proc"].poll() is None and not late:
                continue
            if late and r["proc"].poll() is None:
                r["proc"].kill()
            r["proc"].wait()
            r["log"].close()
            r["seen"] = read_rows(r["rows"], r["seen"], on_row)
            running.remove(r)
            p, rc = r["phase"], r["proc"].returncode
            status[p.name] = {"rc": rc, "rows": r["seen"], "log": r["log_path"],
                              "why": "stopped at the deadline" if late else ""}
            print(f"[{time.strftime('%H:%M:%S')}] {p.name} ended rc={rc}, {r['seen']} of "
                  f"{len(p.geometries)} geometries" + (" (deadline)" if late else ""), flush=True)
    return status


def read_rows(path: str, seen: int, on_row) -> int:
    """Rows a phase appended since ``seen`` (whole lines only: it may be mid-write)."""
    if not os.path.exists(path):
        return seen
    with open(path) as f:
        lines = f.read().split("\n")[:-1]  # the part after the last newline is unfinished
    for line in lines[seen:]:
        on_row(json.loads(line))
    return len(lines)


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
