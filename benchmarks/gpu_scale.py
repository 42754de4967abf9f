"""A long prefix restored from disk on the GPU, kvscope on vs off in one process.

On the H200 a 131k-token restore made kvscope lose events and looked slower than stock
(two fresh processes each, 8.3/7.5 s observed vs 7.2/5.2 s stock: nothing resolved). Here
one process holds one engine with ``ObservedOffloadingConnector`` (tiering: the CPU
primary tier and an fs tier on disk, ``checksum_policy`` refuse) and alternates
iterations with kvscope **on** and **off** (kvscope.sim.kvscope_switch: off is vLLM's stock code
path) in ABBA pairs, as gpu_within_process.py does, so process-to-process spread drops out
of each pair.

An iteration (``--tokens`` T, one prompt fills the GPU blocks and the primary tier,
``rows`` >= 8,000): ask prompt k+1 (its prefill evicts prompt k from the GPU blocks and
from the primary tier; its chunks are stored and cascade to disk; the engine is settled,
untimed), then re-ask prompt k: its prefix is promoted from disk and loaded. With
``--between restore`` (reask_schedule.py) prompts 0, 1 and 2 are asked once, then re-asked
in turn, each evicted by the others' restores: no prefill before a timed restore, about twice
the pairs per minute. Timed: the re-ask (``restore_s``, the
measure: restore wall time; tokens/s = restored tokens / restore_s). Per iteration also:
the tokens it restored (vLLM's ``num_cached_tokens``) and loaded from the tiers (vLLM's
connector's answer), kvscope's split of the re-ask's time while on (``kvscope_split``:
seconds per restore phase, deferred rescans and their keys), whether its output equals the first
ask's, the prefill's time, the digests' wall time on both sides (scheduler: promoted rows
at completion; the rank: the check before each load), kvscope's threads' CPU.

Checked: every re-ask restored the same tokens in both arms, with its first output; over
the run kvscope's hit counter grew by exactly the tokens restored while on and
``kvscope_telemetry_errors_total`` stayed 0. Reported: the geometric mean over pairs of
restore_s(off) / restore_s(on) (= tokens/s on / off) with a t and a bootstrap 95 % CI.

A Llama with dummy weights built on the spot: ``--shape tiny`` (4 layers, hidden 256, 2 KV
heads: 32 KiB of KV per 16-token block; the scheduler's CPU is most of a restore) or ``1b``
(Llama-3.2-1B's: 16 layers, 8 KV heads, 512 KiB a block; with ``--prune-fs`` each prompt's
fs files are removed once it is not asked again, or tmpfs fills). Needs the in-process engine
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and a disk directory for the fs tier:

    python3 benchmarks/gpu_scale.py case --tokens 131000 --pairs 12 --fs-root /tmp/fs \\
        --deadline-s 520 --out R.json
    python3 benchmarks/gpu_scale.py case ... --checksum-policy off   # kvscope without digests
    python3 benchmarks/gpu_scale.py case ... --hold-modes reads,none  # the aggregator's
        # hold-back during a restore's reads on / off, alternated by ABBA blocks in one process
    python3 benchmarks/gpu_scale.py case ... --shape 1b --prune-fs    # a real model's rows
    python3 benchmarks/gpu_scale.py case ... --between restore   # three prompts restored in turn
    python3 benchmarks/gpu_scale.py summarize R.json [R2.json ...]       # gpu_scale_summary.py
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time

from kvscope.sim import thread_cpu
from kvscope.sim.call_clock import SCHEDULER_CALLS, WORKER_CALLS, CallClock, clocks_per_call
from kvscope.sim.drain_log import DrainLog
from kvscope.sim.gc_clock import GCClock
from kvscope.sim.gpu_scale_summary import by_hold, summarize_files, summary
from kvscope.sim.kvscope_switch import KvscopeSwitch, own_function, quiet
from kvscope.sim.pair_stats import abba, block_mode
from kvscope.sim.promotion_count import PromotionCount
from kvscope.sim.reask_schedule import (
    BETWEEN,
    asked_again,
    first_asks,
    iteration,
    prune,
    refuse_pruning,
)

T_START = time.monotonic()
CHUNK = 16
# Model shapes (dummy weights): tiny is every run's before 2026-12-05 (the scheduler's CPU is
# most of a restore); 1b is Llama-3.2-1B's (16 layers, 8 KV heads: 512 KiB of KV a block)
SHAPES = {"tiny": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64},
          "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64}}
VOCAB = 32_000
OUT_TOKENS = 4
SETTLE_PROMPT = {"prompt_token_ids": [7, 8, 9]}  # shorter than a block: stores nothing


def kv_block_bytes(shape: str) -> int:
    """KV bytes of one 16-token block: layers x K,V x KV heads x head dim x tokens x bf16
    (tiny: 32 KiB)."""
    m = SHAPES[shape]
    return m["num_hidden_layers"] * 2 * m["num_key_value_heads"] * m["head_dim"] * CHUNK * 2


def write_config(d: str, max_len: int, shape: str = "tiny") -> None:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPES[shape],
           "vocab_size": VOCAB,
           "max_position_embeddings": max_len, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 1,
           "eos_token_id": 2, "hidden_act": "silu"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def prompt(k: int, tokens: int) -> dict:
    r = random.Random(7_919 * (k + 11))
    return {"prompt_token_ids": [r.randrange(3, VOCAB) for _ in range(tokens)]}


def geometry(tokens: int, rows: int | None) -> dict:
    keys = tokens // CHUNK
    rows = rows or max(8_000, keys + 800)
    if rows >= 2 * keys:
        raise SystemExit(f"{rows} rows hold two prompts of {keys} keys: nothing would cascade")
    return {"tokens": tokens, "keys": keys, "rows": rows, "gpu_blocks": keys + 64,
            "max_len": tokens + 64}


class Answers:
    """What vLLM's connector answered each lookup round (the tokens a request loads from the
    tiers: vLLM's truth, not kvscope's), in order. Wrapped on the scheduler's connector and
    wrapped again at each switch (KvscopeSwitch.clocks: its method changes with the state)."""

    NAME = "get_num_new_matched_tokens"

    def __init__(self, connector) -> None:
        self.connector = connector
        self.answers: list = []
        self._own = None
        self.rewrap()

    def rewrap(self) -> None:
        inner = getattr(self.connector, self.NAME)
        self._own = own_function(self.connector, self.NAME)

        def answered(request, num_computed):
            out = inner(request, num_computed)
            self.answers.append(out[0])
            return out

        setattr(self.connector, self.NAME, answered)

    def unwrap(self) -> None:
        if self._own is None:
            delattr(self.connector, self.NAME)
        else:
            setattr(self.connector, self.NAME, self._own)

    def loaded_since(self, mark: int) -> int:
        """The last tokens-to-load answer since ``mark`` (0: none)."""
        return next((a for a in reversed(self.answers[mark:]) if a), 0)


def scrape(url: str) -> dict[str, float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + json.dumps(dict(sorted(s.labels.items())))
            out[key] = s.value
    return out


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(name + "{"))


def run_case(tokens: int, rows: int | None, pairs: int, warmup: int, fs_root: str,
             deadline: float | None, out_path: str | None, checksum_policy: str = "refuse",
             checksum_threads: int | None = None, checksum_scope: str = "unshared",
             hold_modes: tuple[str, ...] = ("reads",), shape: str = "tiny",
             prune_fs: bool = False, between: str = "prefill") -> dict:
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise SystemExit("needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (the engine in this process)")
    if prune_fs:
        refuse_pruning(between)
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
        OffloadingConnectorScheduler,
    )

    from kvscope.connector.compat import SCAN_METHOD
    from kvscope.sim.gpu_workload import free_port

    g = geometry(tokens, rows)
    d = tempfile.mkdtemp(prefix="kvscope-scale-")
    write_config(d, g["max_len"], shape)
    os.makedirs(fs_root, exist_ok=True)
    port = free_port()
    ktc = KVTransferConfig(
        kv_connector="ObservedOffloadingConnector", kv_connector_module_path="kvscope.connector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "cpu_bytes_to_use": g["rows"] * kv_block_bytes(shape), "block_size": CHUNK,
            "spec_name": "TieringOffloadingSpec",
            "secondary_tiers": [{"type": "fs", "root_dir": fs_root, "n_read_threads": 16,
                                 "n_write_threads": 16}],
            "kvscope": {"exporter_port": port, "checksum_policy": checksum_policy,
                        "checksum_threads": checksum_threads,
                        "checksum_scope": checksum_scope}})
    # vLLM's own scan in both arms: a clock on its class's method, put there before the
    # engine is built, so stock calls it and kvscope's tap calls it (the method the tap
    # found); the "scan" clock below is the tap itself when on. Their difference on is
    # kvscope's work per scan; this clock's on/off difference is vLLM's scan slowed
    vllm_scan = CallClock().wrap(OffloadingConnectorScheduler, SCAN_METHOD)
    t0 = time.perf_counter()
    llm = LLM(model=d, skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16",
              block_size=CHUNK, num_gpu_blocks_override=g["gpu_blocks"],
              max_model_len=g["max_len"], max_num_batched_tokens=8192, max_num_seqs=4,
              gpu_memory_utilization=0.5, enable_prefix_caching=True, enforce_eager=True,
              kv_transfer_config=ktc, disable_log_stats=False, seed=0)
    res: dict = {**g, "checksum_policy": checksum_policy,
                 "checksum_threads": checksum_threads, "checksum_scope": checksum_scope,
                 "engine_up_s": round(time.perf_counter() - t0, 1), "pid": os.getpid(),
                 "cmd": sys.argv}
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    worker = get_kv_transfer_group()
    switch = KvscopeSwitch(scheduler, [worker])
    res["lookups_from_scan"] = switch.observer.lookups_from_scan
    res.update(hold_modes=list(hold_modes), shape=shape, kv_block_bytes=kv_block_bytes(shape),
               prune_fs=prune_fs, between=between)
    answers = Answers(scheduler.connector)
    switch.clocks.append(answers)
    # the engine thread's CPU per connector call (which call kvscope's time is in), and
    # inside the prefix scan (vLLM's per-key lookups, with kvscope's tap when on)
    per_call = {**clocks_per_call(scheduler.connector, SCHEDULER_CALLS, "s."),
                **clocks_per_call(worker, WORKER_CALLS, "w."),
                "scan": CallClock().wrap(switch.cs, SCAN_METHOD)}
    switch.clocks += list(per_call.values())
    # what vLLM promoted per re-ask (a churning restore promotes more keys than it has)
    promotions = PromotionCount(switch.manager)
    switch.clocks.append(promotions)
    # digests: wall time (they fan out over kvscope's digest threads)
    digests = {"scheduler": CallClock(time.perf_counter).wrap(switch.observer.rows.digester,
                                                              "many"),
               "rank0": CallClock(time.perf_counter).wrap(worker.kvscope_worker._digester,
                                                          "many")}
    # the aggregator's periodic drains (its thread), each (start, end, its CPU): whether one
    # ran while a restore's reads were in flight (it holds back then, at most MAX_DEFER_S at
    # a time) or after them
    drains = DrainLog().wrap(switch.observer.agg)
    # the process's collections (any thread's): kvscope's once ran 86 inside a 131k
    # restore's promoting scan on CPU, vLLM's none (docs/measured-facts.md)
    collections = GCClock()
    gc.callbacks.append(collections)
    sp = SamplingParams(temperature=0.0, max_tokens=OUT_TOKENS, ignore_eos=True,
                        detokenize=False)
    tiny = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    url = f"http://127.0.0.1:{port}/metrics"

    def settle() -> None:
        """No request, no connector job and no tier job (a cascade or a promotion that
        finished in the other state would leave kvscope's books open): the tiering
        manager's own test."""
        for _ in range(600):
            if quiet(scheduler) and not switch.manager.has_pending_work():
                return
            llm.generate([SETTLE_PROMPT], tiny, use_tqdm=False)
            time.sleep(0.02)  # the fs tier's threads finish what is in flight
        raise RuntimeError("engine not settled after 600 settling requests")

    def ask(k: int):
        return llm.generate([prompt(k, tokens)], sp, use_tqdm=False)[0]

    first_out = {}
    for j in first_asks(between):
        settle()
        first_out[j] = list(ask(j).outputs[0].token_ids)
    order = abba(warmup, pairs)
    iters: list[dict] = []
    before = None
    pair_s: list[float] = []
    pair_t = time.monotonic()
    for k, on in enumerate(order):
        if k >= warmup and (k - warmup) % 2 == 0:
            now = time.monotonic()
            if k > warmup:
                pair_s.append(now - pair_t)
            pair_t = now
            if deadline is not None and pair_s and deadline - now < 1.3 * max(pair_s) + 20:
                res["stopped"] = "deadline"
                break
        settle()
        # the aggregator's hold-back for this pair, in blocks of two ABBA pairs
        mode = block_mode(hold_modes, k, warmup)
        switch.hold_back(mode)
        switch.set(on)
        if k == warmup:
            before = scrape(url)
        d0 = {n: c.seconds for n, c in digests.items()}
        calls0 = {n: c.seconds for n, c in per_call.items()}
        threads0 = thread_cpu.snapshot()
        evict, timed = iteration(between, k)
        asked_at = time.time()  # the fs tier's files of prompt k+1 are younger
        t = time.perf_counter()
        new = ask(evict) if evict is not None else None
        t1 = time.perf_counter()
        # its stores cascaded to disk first: rows pinned by a cascade in flight would leave
        # the restore fewer free rows (its promotions refused, a wait as long as the disk's
        # writes) in whichever arm it happened to fall (one recorded H200 re-ask took 27.9 s)
        settle()
        threads1 = thread_cpu.snapshot()  # before the clock starts: it reads /proc
        t1s = time.perf_counter()
        mark = len(answers.answers)
        scan, lookups = per_call["scan"], per_call.get("s.get_num_new_matched_tokens")
        r0 = (scan.calls, scan.seconds, lookups.calls if lookups else 0)
        v0 = (vllm_scan.calls, vllm_scan.seconds)
        scan.longest = vllm_scan.longest = 0.0
        gc0 = collections.totals()
        p0 = promotions.snapshot()
        promotions.longest_job_s = 0.0
        promotions.windows.clear()
        drains.spans.clear()
        split0 = restore_split(switch.observer) if on else None
        again = ask(timed)
        p1 = promotions.snapshot()
        gc1 = collections.totals()
        t2 = time.perf_counter()
        threads2 = thread_cpu.snapshot()
        threads = thread_cpu.between(threads0, threads2)
        pruned = prune(fs_root, asked_at) if prune_fs else None  # prompt k is never asked again
        if new is not None:
            first_out[evict] = list(new.outputs[0].token_ids)
        want = first_out[timed] if asked_again(between) else first_out.pop(timed)
        it = {"k": k, "on": on, "hold": mode, "prompt": timed, "s": round(t2 - t1s, 4),
              "prefill_s": round(t1 - t, 4) if new is not None else None,
              "settle_s": round(t1s - t1, 4),
              "restored": again.num_cached_tokens or 0,
              "loaded": answers.loaded_since(mark),
              "same_output": list(again.outputs[0].token_ids) == want,
              "digest_wall_s": {n: round(c.seconds - d0[n], 4) for n, c in digests.items()},
              "calls_cpu_s": {n: round(c.seconds - calls0[n], 4) for n, c in per_call.items()},
              # the re-ask alone: vLLM's prefix scans (how many: one per lookup of a step
              # while the restore waits) and the connector's lookups
              "reask": {"scan_calls": scan.calls - r0[0],
                        "scan_cpu_s": round(scan.seconds - r0[1], 4),
                        # the longest: the one that starts the restore's promotions (one
                        # per key; on CPU the second, after the fs tier's existence checks)
                        "scan_cpu_longest_s": round(scan.longest, 4),
                        "lookup_calls": (lookups.calls if lookups else 0) - r0[2],
                        # vLLM's scan alone (without kvscope's tap around it when on)
                        "vllm_scan_calls": vllm_scan.calls - v0[0],
                        "vllm_scan_cpu_s": round(vllm_scan.seconds - v0[1], 4),
                        "vllm_scan_cpu_longest_s": round(vllm_scan.longest, 4),
                        # the process's collections while it ran (any thread's)
                        "gc": {"collections": [b - a for a, b in zip(gc0[0], gc1[0])],
                               "s": round(gc1[1] - gc0[1], 4)},
                        # vLLM's promotions: jobs, keys (> the prompt's: churned), failed keys
                        "promotions": {**dict(zip(("jobs", "keys", "failed_keys"),
                                                  (b - a for a, b in zip(p0, p1)))),
                                       "longest_job_s": round(promotions.longest_job_s, 4)},
                        # kvscope's periodic drains that started while its reads were in
                        # flight, and the others (count, their thread's CPU)
                        "drains": drains.split(promotions.windows),
                        # the threads' CPU during the re-ask alone (kvscope's aggregator
                        # holds back while the promotion reads: does its drain fall in here?)
                        "threads": thread_cpu.between(threads1, threads2)},
              "threads": threads, "pruned_files": pruned}
        if split0 is not None:  # kvscope's own split of the re-ask's time (restore_clock.py)
            split1 = restore_split(switch.observer)
            it["kvscope_split"] = {k: round(split1[k] - split0[k], 4) for k in split1}
        it["tokens_per_s"] = round(it["restored"] / it["s"], 1)
        print(json.dumps(it), flush=True)
        if k >= warmup:
            iters.append(it)
            if out_path and len(iters) % 2 == 0:
                _write(out_path, {**res, "iters": iters})
    settle()
    switch.set(True)
    time.sleep(2 * switch.observer.agg.interval_s)  # the aggregator's next refresh: gauges
    after = scrape(url)
    on_restored = sum(i["loaded"] for i in iters if i["on"])
    res.update(iters=iters, checks=checks(iters, before or {}, after, on_restored))
    if len(iters) >= 2:
        res["summary"] = summary(iters)
        res.update(by_hold(iters))
    if out_path:
        _write(out_path, res)
    return res


def restore_split(observer) -> dict[str, float]:
    """kvscope's restore time split so far (seconds per phase, rescans, keys rescanned),
    after a synchronous drain."""
    from kvscope.exporters import signals as S

    observer.refresh()
    rec = observer.rec
    out = {p.value: rec.value(S.RESTORE_PHASE_SECONDS, (p.value,)) for p in S.RestorePhase}
    out["rescans"] = rec.value(S.RESTORE_RESCANS)
    out["rescan_keys"] = rec.value(S.RESTORE_RESCAN_KEYS)
    return out


def checks(iters: list[dict], before: dict, after: dict, on_restored: int) -> dict:
    # per-iteration restored tokens, as (on, off); kvscope's hit counter while on
    from kvscope.exporters import signals as S

    grew = total(after, S.HIT_TOKENS.name) - total(before, S.HIT_TOKENS.name)
    return {"restored": sorted({i["restored"] for i in iters}),
            "loaded": sorted({i["loaded"] for i in iters}),
            "same_output": all(i["same_output"] for i in iters),
            "hit_tokens_grew": grew,
            "loaded_while_on": on_restored,
            "telemetry_errors": total(after, S.TELEMETRY_ERRORS.name),
            "pending_transfers_after": total(after, S.PENDING_TRANSFERS.name)}


def _write(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("case")
    c.add_argument("--tokens", type=int, default=131_000)
    c.add_argument("--rows", type=int, default=None, help="default: max(8000, keys + 800)")
    c.add_argument("--pairs", type=int, default=12)
    c.add_argument("--warmup", type=int, default=2)
    c.add_argument("--fs-root", required=True, help="a directory on disk (not tmpfs)")
    c.add_argument("--deadline-s", type=float, default=None,
                   help="stop between pairs so the run ends this many seconds after start")
    c.add_argument("--out")
    c.add_argument("--checksum-policy", default="refuse", choices=["refuse", "observe", "off"])
    c.add_argument("--checksum-threads", type=int, default=None,
                   help="kvscope's checksum_threads setting (default: its automatic choice)")
    c.add_argument("--checksum-scope", default="unshared", choices=["unshared", "all"],
                   help="kvscope's checksum_scope (unshared: TP=1 here shares the scheduler's "
                        "file, so nothing is digested; all: every rank digested)")
    c.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    c.add_argument("--prune-fs", action="store_true",
                   help="after each re-ask remove the fs files of prompts not asked again")
    c.add_argument("--between", default="prefill", choices=BETWEEN,
                   help="what evicts the timed prompt before its re-ask: the next prompt's "
                        "prefill, or the other two prompts' restores, three prompts in turn "
                        "(reask_schedule.py)")
    c.add_argument("--hold-modes", default="reads",
                   help="comma-separated, alternated by blocks of two pairs: reads (kvscope's "
                        "default: the aggregator holds back while a restore's promotion "
                        "reads) and/or none (it drains every interval)")
    s = sub.add_parser("summarize")
    s.add_argument("files", nargs="+")
    a = p.parse_args()
    if a.cmd == "summarize":
        print(json.dumps(summarize_files(a.files), indent=1))
        return 0
    deadline = T_START + a.deadline_s if a.deadline_s else None
    res = run_case(a.tokens, a.rows, a.pairs, a.warmup, a.fs_root, deadline, a.out,
                   a.checksum_policy, a.checksum_threads, a.checksum_scope,
                   tuple(m for m in a.hold_modes.split(",") if m), a.shape, a.prune_fs,
                   a.between)
    print(json.dumps({k: v for k, v in res.items() if k != "iters"}))
    ok = (res["checks"]["telemetry_errors"] == 0 and res["checks"]["same_output"]
          and len(res["checks"]["restored"]) == 1
          and res["checks"]["hit_tokens_grew"] == res["checks"]["loaded_while_on"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
