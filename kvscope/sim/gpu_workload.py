"""The scheduler-bound GPU workload the within-process overhead and restore benchmarks share:
a Llama-3.2-1B-shaped model (hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192) with
``load_format="dummy"`` (a config.json, no weights, no tokenizer: token ids in), its batches
(96 new 1,024-token prompts, then the previous iteration's 96 again, restored from the CPU
tier), the GPU's block count, CPU pinning (``pin_cpus``: the GPU's NUMA node minus CPU 0;
``pin_main_thread``: the engine's thread alone on one CPU), a GC watch, a scrape of the
exporter, and one case in a fresh process (vLLM keeps process-wide state)."""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
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


