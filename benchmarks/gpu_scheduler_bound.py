"""Overhead where the scheduler is the bottleneck: a 1B-shaped Llama at high concurrency on a GPU.

Issue 13 item 1. Each process is fresh (vLLM keeps process-wide state) and runs one arm:
``stock`` (vLLM's ``OffloadingConnector``) or ``observed`` (``ObservedOffloadingConnector``),
``CPUOffloadingSpec``, sync (``async_scheduling=False``) or ``--async-scheduling``. Workload
per iteration: 96 new 1,024-token prompts (96 tokens out each), then the 96 prompts of the
previous iteration again, which two batches have pushed out of the GPU's prefix cache, so they
restore ~96 x 1,008 tokens from the CPU tier (engine truth: vLLM's ``num_cached_tokens``).

The model is Llama-3.2-1B-shaped (hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192)
with ``load_format="dummy"`` (a config.json, no weights, no tokenizer: token ids in), bf16,
CUDA graphs. KV per 16-token block: 512 KiB. GPU: 8,192 blocks; CPU tier: 24 GiB.

Per-process throughput on one config is bimodal (issue 13: 1.2 s vs 1.8-2.0 s per
iteration), so ``all`` alternates the arms (ABBA) over fresh processes and reports per-process
medians, the ratio of the arms' medians with a bootstrap 95 % CI over processes, and the
paired (adjacent processes) log-ratio with a t interval. Each process records what could
explain its mode: CPU affinity and the CPUs its main thread ran on, CPU steal time, context
switches, GC collections and GC time in the timed region, the GPU's NUMA node.

    python3 benchmarks/gpu_scheduler_bound.py all --pairs 3 --modes sync async --out R.json
    python3 benchmarks/gpu_scheduler_bound.py summarize R.json [R2.json ...]
    python3 benchmarks/gpu_scheduler_bound.py case --arm observed --mode sync   # one process

``--pin auto`` (default) runs every process on the CPUs of the GPU's NUMA node (all CPUs
where the machine has one node) minus CPU 0; ``--pin none`` leaves placement to the kernel;
``--pin main`` does as ``auto``, then, once the engine is up, gives the main thread (the
engine's scheduler and the driver: in-process engine) the first of those CPUs alone and every
other thread the rest, so no other thread of the process competes for the scheduler's CPU.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BATCH, PROMPT, OUT = 96, 1024, 96
VOCAB = 32000
# The CPU tier must hold 3 batches' prompts (18,432 chunks): between a batch's store and its
# re-ask come the re-ask of the batch before (a touch: most recent) and a new batch, so LRU
# evicts the batch due next first. With 16,384 rows (8 GiB) the re-asks thrashed (0 tokens
# restored on the H200); 24 GiB leaves room even if vLLM pads a row to 1 MiB.
GPU_BLOCKS, CPU_BYTES = 8192, 24 << 30
# --cpu-gib: a smaller tier starts faster (pinned host memory is allocated per process). A row
# is 512 KiB (kvscope_primary_row_bytes on the H200) and a batch stores 6,144 rows (3 GiB):
# 12 GiB holds 4 batches, 9 GiB the 3 the LRU order needs. The re-asks' restored tokens are
# recorded per iteration: a thrashing tier shows there.
STARTUP_MARKS = ("took", "finished in", "seconds", "Compil", "compil", "capturing", "Loading",
                 "Allocating")  # vLLM log lines carry their time of day: the CPU tier's too
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
        10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}


def t975(df: int) -> float:
    return T975.get(df) or T975[max(k for k in T975 if k <= df)] if df >= 1 else float("nan")


def write_config(d: str) -> None:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
           "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 64, "vocab_size": VOCAB,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 1,
           "eos_token_id": 2, "hidden_act": "silu"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def batch(k: int) -> list[dict]:
    r = random.Random(1_000_003 * (k + 7))  # the same prompts in every process
    return [{"prompt_token_ids": [r.randrange(3, VOCAB) for _ in range(PROMPT)]}
            for _ in range(BATCH)]


def gpu_numa_node() -> int | None:
    for dev in glob.glob("/sys/bus/pci/devices/*"):
        try:
            with open(f"{dev}/vendor") as f, open(f"{dev}/class") as c:
                if f.read().strip() == "0x10de" and c.read().startswith("0x030"):
                    with open(f"{dev}/numa_node") as n:
                        return int(n.read())
        except OSError:
            continue
    return None


def pin_cpus(spec: str) -> list[int] | None:
    if spec == "none":
        return None
    if spec == "main":
        spec = "auto"
    if spec != "auto":
        out: list[int] = []
        for part in spec.split(","):
            a, _, b = part.partition("-")
            out.extend(range(int(a), int(b or a) + 1))
        return out
    node = gpu_numa_node()
    cpus = sorted(os.sched_getaffinity(0))
    if node is not None and node >= 0:
        try:
            with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
                cpus = pin_cpus(f.read().strip()) or cpus
        except OSError:
            pass
    return [c for c in cpus if c != 0] or cpus  # CPU 0 takes most interrupts


def proc_stat_steal() -> float:
    with open("/proc/stat") as f:
        parts = f.readline().split()  # cpu user nice system idle iowait irq softirq steal
    return int(parts[8]) / os.sysconf("SC_CLK_TCK") if len(parts) > 8 else float("nan")


def ctx_switches() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if "ctxt_switches" in line:
                k, v = line.split(":")
                out[k.strip()] = int(v)
    return out


class GCWatch:
    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = 0.0
        self._t = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t
            self.count[info.get("generation", 0)] += 1


def pin_main_thread() -> dict:
    """The main thread on one CPU of the process's set, every other thread on the rest."""
    cpus = sorted(os.sched_getaffinity(0))
    main, rest = cpus[:1], cpus[1:] or cpus
    me = threading.get_native_id()
    moved = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), main if int(tid) == me else rest)
            moved += 1
        except OSError:
            pass  # a thread that ended meanwhile
    return {"main_cpu": main, "other_cpus": rest, "threads_pinned": moved}


def run_case(arm: str, mode: str, iters: int, warmup: int, pin: str = "auto",
             cpu_bytes: int = CPU_BYTES) -> dict:
    t_import = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    import_s = round(time.perf_counter() - t_import, 1)

    d = tempfile.mkdtemp(prefix="kvscope-1b-")
    write_config(d)
    observed = arm == "observed"
    port = free_port()  # kvscope's endpoint, scraped once after the timed region
    ktc = KVTransferConfig(
        kv_connector="ObservedOffloadingConnector" if observed else "OffloadingConnector",
        kv_connector_module_path="kvscope.connector" if observed else None, kv_role="kv_both",
        kv_connector_extra_config={"cpu_bytes_to_use": cpu_bytes, "block_size": 16,
                                   **({"kvscope": {"exporter_port": port}} if observed else {})})
    t0 = time.perf_counter()
    llm = LLM(model=d, skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16",
              block_size=16, num_gpu_blocks_override=GPU_BLOCKS, max_model_len=2048,
              max_num_seqs=128, gpu_memory_utilization=0.5, enable_prefix_caching=True,
              kv_transfer_config=ktc, disable_log_stats=False, seed=0,
              async_scheduling=(mode == "async"),
              compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32, 48, 64,
                                                              96, 128]})
    res: dict = {"arm": arm, "mode": mode, "engine_up_s": round(time.perf_counter() - t0, 1),
                 "vllm_import_s": import_s, "cpu_tier_gib": round(cpu_bytes / (1 << 30), 2),
                 "affinity": sorted(os.sched_getaffinity(0)), "gpu_numa_node": gpu_numa_node(),
                 "pid": os.getpid()}
    if pin == "main":
        res["pin_main"] = pin_main_thread()
    sp = SamplingParams(temperature=0.0, max_tokens=OUT, ignore_eos=True, detokenize=False)
    llm.generate(batch(-1), sp, use_tqdm=False)  # the first re-ask's batch
    watch = GCWatch()
    cpus: set[int] = set()
    sampling = threading.Event()

    def sample_cpu(main_tid: int = threading.get_native_id()) -> None:
        if pin == "main":  # off the scheduler's CPU (a thread inherits its creator's set)
            os.sched_setaffinity(0, res["pin_main"]["other_cpus"])
        path = f"/proc/self/task/{main_tid}/stat"
        while not sampling.wait(0.05):
            try:
                with open(path) as f:
                    cpus.add(int(f.read().rsplit(")", 1)[1].split()[36]))
            except OSError:
                return

    iter_s, restored, tokens = [], [], []
    for k in range(warmup + iters):
        if k == warmup:  # timed region: GC, steal, context switches, CPUs of the main thread
            gc.callbacks.append(watch)
            steal0, ctx0, tw = proc_stat_steal(), ctx_switches(), time.perf_counter()
            threading.Thread(target=sample_cpu, daemon=True).start()
        t = time.perf_counter()
        new = llm.generate(batch(k), sp, use_tqdm=False)
        again = llm.generate(batch(k - 1), sp, use_tqdm=False)
        dt = time.perf_counter() - t
        if k >= warmup:
            iter_s.append(round(dt, 4))
            restored.append(sum(o.num_cached_tokens or 0 for o in again))
            tokens.append(sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids)
                              for o in new + again))
    sampling.set()
    gc.callbacks.remove(watch)
    ctx1 = ctx_switches()
    med = statistics.median(iter_s)
    res.update(iter_s=iter_s, median_iter_s=med, tokens_per_iter=tokens[0],
               tokens_per_s=round(tokens[0] / med, 1), reask_cached_tokens=restored,
               timed_wall_s=round(time.perf_counter() - tw, 2),
               steal_s=round(proc_stat_steal() - steal0, 2),
               ctx_switches={k: ctx1[k] - ctx0.get(k, 0) for k in ctx1},
               gc_collections=watch.count, gc_s=round(watch.seconds, 4),
               main_thread_cpus=sorted(cpus), torch_threads=_torch_threads(),
               threads=threading.active_count(), tasks=tasks_by_affinity())
    if observed:  # what kvscope saw (rows of the tier; hits), after the timed region
        res["kvscope"] = scrape(f"http://127.0.0.1:{port}/metrics", (
            "kvscope_primary_rows", "kvscope_primary_row_bytes", "kvscope_hit_tokens_total",
            "kvscope_lookup_rounds_total", "kvscope_telemetry_errors_total"))
    return res


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str, names: tuple[str, ...]) -> dict[str, float]:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            lines = r.read().decode().splitlines()
    except OSError as exc:
        return {"error": repr(exc)}
    return {k: float(v) for k, _, v in (ln.rpartition(" ") for ln in lines)
            if k.startswith(names) and not k.startswith("#")}


def tasks_by_affinity() -> dict[str, int]:
    """Threads of this process per allowed-CPU set (were threads born after the pinning?)."""
    out: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            cpus = sorted(os.sched_getaffinity(int(tid)))
        except OSError:
            continue
        key = f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0])
        out[key] = out.get(key, 0) + 1
    return out


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def run_case_process(cmd: list[str], timeout: float, ident: dict) -> tuple[dict, str]:
    """One case in a fresh process (vLLM keeps process-wide state): the last JSON line of
    its stdout plus ``process_s``, or ``ident`` with the error and the output's tail; and
    its whole output (stderr, then stdout: vLLM logs to stdout) for the caller."""
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""  # bytes even with text=True
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        for line in reversed(out.splitlines()):  # a case's last checkpoint, if it prints any
            if line.startswith("{"):
                try:  # the last line may be cut mid-write
                    return {**json.loads(line), "process_s": timeout, "cut": "timeout"}, out
                except ValueError:
                    continue
        return {**ident, "error": "timeout", "process_s": timeout,
                "tail": str(exc.stderr or "")[-2000:]}, ""
    output = p.stderr + p.stdout
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return {**json.loads(line), "process_s": round(time.perf_counter() - t, 1)}, output
    return {**ident, "error": p.returncode, "tail": (p.stdout + p.stderr)[-3000:]}, output


def spawn(arm: str, mode: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "case", "--arm", arm, "--mode", mode,
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--pin", args.pin,
           "--cpu-gib", str(args.cpu_gib)]
    res, output = run_case_process(cmd, args.case_timeout, {"arm": arm, "mode": mode})
    if "error" not in res:  # where its start went: vLLM's own timing lines
        res["startup_log"] = [ln[-240:] for ln in output.splitlines()
                              if any(m in ln for m in STARTUP_MARKS)
                              and not ln.startswith("{")][-25:]
    return res


def summarize(runs: list[dict], seed: int = 0) -> dict:
    out: dict = {}
    for mode in sorted({r["mode"] for r in runs}):
        ok = [r for r in runs if r["mode"] == mode and "tokens_per_s" in r]
        arm = {a: [r["tokens_per_s"] for r in ok if r["arm"] == a] for a in ("stock", "observed")}
        if not arm["stock"] or not arm["observed"]:
            out[mode] = {"error": "an arm has no completed process", "runs": len(ok)}
            continue
        ratio = statistics.median(arm["observed"]) / statistics.median(arm["stock"])
        rng, boots = random.Random(seed), []
        for _ in range(10000):  # resample processes within each arm
            s = [rng.choice(arm["stock"]) for _ in arm["stock"]]
            o = [rng.choice(arm["observed"]) for _ in arm["observed"]]
            boots.append(statistics.median(o) / statistics.median(s))
        boots.sort()
        m: dict = {"processes": {a: len(v) for a, v in arm.items()},
                   "tokens_per_s": arm, "median_tokens_per_s": {
                       a: statistics.median(v) for a, v in arm.items()},
                   "ratio_observed_over_stock": round(ratio, 4),
                   "ratio_bootstrap_95ci": [round(boots[249], 4), round(boots[9749], 4)]}
        pairs, pending = [], {}
        for r in ok:  # adjacent (stock, observed) processes in run order: paired log-ratios
            pending[r["arm"]] = r["tokens_per_s"]
            if len(pending) == 2:
                pairs.append(math.log(pending["observed"] / pending["stock"]))
                pending = {}
        if len(pairs) >= 2:
            mean, sd = statistics.mean(pairs), statistics.stdev(pairs)
            half = t975(len(pairs) - 1) * sd / math.sqrt(len(pairs))
            m["paired"] = {"pairs": len(pairs), "ratio_geomean": round(math.exp(mean), 4),
                           "t_95ci": [round(math.exp(mean - half), 4),
                                      round(math.exp(mean + half), 4)]}
        out[mode] = m
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("case")
    c.add_argument("--arm", choices=["stock", "observed"], required=True)
    c.add_argument("--mode", choices=["sync", "async"], default="sync")
    a = sub.add_parser("all")
    for q in (c, a):
        q.add_argument("--iters", type=int, default=6)
        q.add_argument("--warmup", type=int, default=2)
        q.add_argument("--pin", default="auto", help="auto | main | none | CPU list (2-9,12)")
        q.add_argument("--cpu-gib", type=float, default=CPU_BYTES / (1 << 30),
                       help="CPU tier size (GiB); >= 9 holds the 3 batches LRU needs")
    a.add_argument("--pairs", type=int, default=3)
    a.add_argument("--first-pair", type=int, default=0,
                   help="continue an ABBA sequence: pair index to start at (its parity: order)")
    a.add_argument("--modes", nargs="+", default=["sync", "async"])
    a.add_argument("--out", default="gpu_scheduler_bound.json")
    a.add_argument("--case-timeout", type=float, default=300)
    a.add_argument("--budget", type=float, default=540, help="no new process after this (s)")
    s = sub.add_parser("summarize")
    s.add_argument("files", nargs="+")
    args = p.parse_args()
    if args.cmd == "case":
        cpus = pin_cpus(args.pin)
        if cpus:
            os.sched_setaffinity(0, cpus)  # before vLLM starts its threads: they inherit it
        print(json.dumps(run_case(args.arm, args.mode, args.iters, args.warmup, args.pin,
                                  int(args.cpu_gib * (1 << 30)))), flush=True)
        return 0
    if args.cmd == "summarize":
        runs = [r for f in args.files for r in json.load(open(f))["runs"]]
        print(json.dumps(summarize(runs), indent=1))
        return 0
    runs: list[dict] = []
    t0, result = time.time(), {"command": " ".join(sys.argv), "runs": runs}
    for i in range(args.first_pair, args.first_pair + args.pairs):
        for mode in args.modes:
            for arm in (("stock", "observed") if i % 2 == 0 else ("observed", "stock")):
                if time.time() - t0 > args.budget:
                    break
                runs.append(spawn(arm, mode, args))
                r = runs[-1]
                print(json.dumps({k: r.get(k) for k in ("arm", "mode", "engine_up_s", "process_s",
                                                        "median_iter_s", "tokens_per_s",
                                                        "steal_s", "gc_s", "main_thread_cpus",
                                                        "error")}), flush=True)
                result["summary"] = summarize(runs)
                with open(args.out, "w") as f:  # after every process: a cut run keeps its data
                    json.dump(result, f, indent=1)
    print(json.dumps(result["summary"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
