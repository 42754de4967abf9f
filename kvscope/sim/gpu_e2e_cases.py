"""End to end on a GPU, the cases: vllm.LLM with ObservedOffloadingConnector (and the stock
one), each in a fresh process (vLLM keeps process-wide state: the KV transfer group, the CUDA
context) printing one JSON line. Cases:

* ``cpu-restore``      CPUOffloadingSpec: ask, flood until evicted, ask again
* ``disk-restore``     TieringOffloadingSpec + fs tier, 100 primary rows: back from disk
* ``ceiling``          tiering, 60 rows, 256-token steps: the capacity ceiling
* ``truncated-100`` / ``truncated-80``: the capacity ceiling's truncated form
* ``checksum-8b``      promoted-row checksums at 8B-shaped rows vs the promotion's own time
* ``overhead-stock`` / ``overhead-observed``: the same workload (3 x 64 prompts of 512
  tokens, 64 out; median tokens/s) with the stock and the observed connector

    python -m kvscope.sim.gpu_e2e_cases cpu-restore     # one case, JSON on stdout

The model is a tiny random Llama built on the spot (4 layers, hidden 256, word-level
tokenizer): no downloads. benchmarks/gpu_e2e.py runs them all; tests/gpu asserts on them.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

KV_BYTES_PER_BLOCK = 32 * 1024  # 4 layers x K,V x 2 KV heads x 64 dims x 16 tokens x bf16
VOCAB = 1021

CASES = {
    "cpu-restore": dict(connector="observed", spec="cpu", cpu_bytes=256 << 20),
    "disk-restore": dict(connector="observed", spec="tiering", cpu_bytes=100 * KV_BYTES_PER_BLOCK),
    "ceiling": dict(connector="observed", spec="tiering", cpu_bytes=60 * KV_BYTES_PER_BLOCK,
                    max_num_batched_tokens=256),
    # the capacity ceiling's truncated form: a 2000-token prompt (125 chunks) all on disk, fewer primary
    # rows than chunks, chunked prefill (each store job fits the rows)
    "truncated-100": dict(connector="observed", spec="tiering", cpu_bytes=100 * KV_BYTES_PER_BLOCK,
                          max_num_batched_tokens=512, prompt_words=2000),
    "truncated-80": dict(connector="observed", spec="tiering", cpu_bytes=80 * KV_BYTES_PER_BLOCK,
                         max_num_batched_tokens=512, prompt_words=2000),
    # promoted-row checksums at 8B-shaped rows (2 MiB per 16-token block) vs
    # the promotion's own time; a 2000-token prompt (125 rows) restored from disk
    # (300 rows: a flood's store finds rows while the previous prompt's cascades pin theirs)
    "checksum-8b": dict(connector="observed", spec="tiering", cpu_bytes=300 * (2 << 20),
                        prompt_words=2000, shape="8b", measure_digest=True, row_bytes=2 << 20),
    "overhead-stock": dict(connector="stock", spec="cpu", cpu_bytes=256 << 20, workload=True),
    "overhead-observed": dict(connector="observed", spec="cpu", cpu_bytes=256 << 20,
                              workload=True),
}


def make_model(d: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(VOCAB):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(d)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=256, intermediate_size=512,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=8192, bos_token_id=1, eos_token_id=2,
                      torch_dtype="bfloat16")
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(d, safe_serialization=True)


def make_shaped_model(d: str, shape: str) -> None:
    """Tokenizer + config.json of a Llama of the given shape, no weights (load_format=dummy)."""
    from transformers import LlamaConfig

    make_model(d)  # the word-level tokenizer (and tiny weights, unused: replaced below)
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            os.remove(os.path.join(d, f))
    dims = {"8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8)}[shape]
    LlamaConfig(vocab_size=VOCAB + 3, max_position_embeddings=8192, bos_token_id=1,
                eos_token_id=2, torch_dtype="bfloat16", **dims).save_pretrained(d)


class DigestClock:
    """Wall seconds kvscope spends digesting promoted rows, per side, in this process
    (the engine in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0). Wraps kvscope's own
    classes, not vLLM's; a subprocess engine leaves both lists empty."""

    def __init__(self) -> None:
        from kvscope.connector.integrity.promoted_rows import PromotedRows
        from kvscope.connector.worker.proxy import WorkerProxy

        self.scheduler: list[float] = []
        self.rank: list[float] = []
        self.threads: int | None = None
        clock = self

        def timed(cls, name: str, into: list[float]) -> None:
            inner = getattr(cls, name)

            def wrapper(obj, *a, **kw):
                t = time.perf_counter()
                try:
                    return inner(obj, *a, **kw)
                finally:
                    into.append(time.perf_counter() - t)
                    digester = getattr(obj, "digester", None)
                    if digester is not None:
                        clock.threads = digester.threads

            setattr(cls, name, wrapper)

        timed(PromotedRows, "digest_promoted", self.scheduler)
        timed(WorkerProxy, "_verify", self.rank)


def digest_seconds_per_byte(row_bytes: int, rows: int = 64) -> float:
    """kvscope's digest of one rank slot (checksums.digest_slots), timed over real-size rows."""
    from kvscope.connector.integrity.checksums import digest_slots

    bufs = [memoryview(os.urandom(row_bytes)) for _ in range(8)]
    digest_slots(bufs[0], row_bytes, 1)
    t = time.perf_counter()
    for i in range(rows):
        digest_slots(bufs[i % 8], row_bytes, 1)
    return (time.perf_counter() - t) / (rows * row_bytes)


def text(seed: int, n: int) -> str:
    r = random.Random(seed)
    return " ".join(f"w{r.randrange(VOCAB)}" for _ in range(n))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if s.name.startswith("kvscope_") and not s.name.endswith(("_bucket", "_created")):
                key = s.name + json.dumps(dict(sorted(s.labels.items())), separators=(",", ":"))
                out[key] = s.value
    return out


def run_case(name: str) -> dict:
    case = dict(CASES[name])
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    from kvscope.connector import ObservedOffloadingConnector

    spans = InMemorySpanExporter()
    if not case.get("workload"):
        # functional cases record spans; overhead cases run as in production without
        # a tracer provider (spans are then no-ops)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        ObservedOffloadingConnector.tracer_provider = provider

    d = tempfile.mkdtemp(prefix="kvscope-gpu-model-")
    if case.get("shape"):
        make_shaped_model(d, case["shape"])
    else:
        make_model(d)
    port = free_port()
    extra: dict = {"cpu_bytes_to_use": case["cpu_bytes"], "block_size": 16}
    if case["spec"] == "tiering":
        fs = os.path.join(os.getcwd(), ".gpu-fs", f"{name}-{os.getpid()}")  # on disk, not tmpfs
        os.makedirs(fs, exist_ok=True)
        extra.update(spec_name="TieringOffloadingSpec", secondary_tiers=[
            {"type": "fs", "root_dir": fs, "n_read_threads": 4, "n_write_threads": 4}])
    observed = case["connector"] == "observed"
    if observed:
        extra["kvscope"] = {"exporter_port": port}
        if case.get("measure_digest"):  # one host: only scope "all" digests at all
            extra["kvscope"]["checksum_scope"] = "all"
    ktc = KVTransferConfig(
        kv_connector="ObservedOffloadingConnector" if observed else "OffloadingConnector",
        kv_connector_module_path="kvscope.connector" if observed else None,
        kv_role="kv_both", kv_load_failure_policy="recompute", kv_connector_extra_config=extra)
    digest_clock = DigestClock() if case.get("measure_digest") else None
    t0 = time.perf_counter()
    kwargs = {}
    if case.get("max_num_batched_tokens"):
        kwargs["max_num_batched_tokens"] = case["max_num_batched_tokens"]
    if case.get("shape"):
        kwargs["load_format"] = "dummy"
    llm = LLM(model=d, tokenizer=d, dtype="bfloat16", enforce_eager=True, block_size=16,
              num_gpu_blocks_override=200, max_model_len=2048, gpu_memory_utilization=0.3,
              kv_transfer_config=ktc, enable_prefix_caching=True, disable_log_stats=False,
              max_num_seqs=8, **kwargs)
    result: dict = {"case": name, "engine_up_s": round(time.perf_counter() - t0, 2)}
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    words = case.get("prompt_words", 1500)
    target = text(1, words)
    before = _scrape(f"http://127.0.0.1:{port}/metrics") if observed else {}
    record_dir = os.environ.get("KVSCOPE_RECORD_DIR")
    recorder = None
    if record_dir and observed:  # the endpoints as timestamped OpenMetrics (kv-diagnose later)
        from kvscope.sim.openmetrics_recording import Recorder, Target

        recorder = Recorder([Target(f"http://127.0.0.1:{port + k}/metrics", "kvscope",
                                    f"gpu:{port + k}") for k in (0, 1)], interval=0.5)
        recorder.__enter__()
    first = llm.generate([target], sp, use_tqdm=False)[0].outputs[0].token_ids
    for seed in range(2, 6):  # flood: evict the target from the GPU prefix cache
        llm.generate([text(seed, words)], sp, use_tqdm=False)
    time.sleep(0.5)  # let stores/cascades settle (the engine steps while they are pending)
    if digest_clock is not None:  # only the re-ask's promotion and load
        digest_clock.scheduler.clear()
        digest_clock.rank.clear()
    t = time.perf_counter()
    again = llm.generate([target], sp, use_tqdm=False)[0]
    result["reask_s"] = round(time.perf_counter() - t, 4)
    result["same_output"] = list(first) == list(again.outputs[0].token_ids)
    result["num_cached_tokens"] = getattr(again, "num_cached_tokens", None)
    result["prompt_tokens"] = len(again.prompt_token_ids)
    if recorder is not None:
        time.sleep(3)  # a few idle scrapes after the re-ask
        urls = [t.url for t in recorder.targets]
        diag = subprocess.run([sys.executable, "-m", "kvscope.diagnostics.cli", "--scrape", *urls,
                               "--json"], capture_output=True, text=True, timeout=120)
        result["kv_diagnose_exit"] = diag.returncode
        try:
            report = json.loads(diag.stdout)
            result["kv_diagnose_verdicts"] = [v["id"] for v in report.get("verdicts", [])]
            result["kv_diagnose"] = report
        except ValueError:
            result["kv_diagnose"] = (diag.stdout + diag.stderr)[-2000:]
        recorder.__exit__(None, None, None)
        recorder.recording.write(os.path.join(record_dir, f"{name}.om.gz"))
    if case.get("workload"):
        wsp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        llm.generate([text(99, 512)] * 4, wsp, use_tqdm=False)  # warm-up
        rates = []
        for rep in range(int(os.environ.get("KVSCOPE_GPU_REPS", "3"))):
            batch = [text(1000 * rep + i, 512) for i in range(64)]
            t = time.perf_counter()
            outs = llm.generate(batch, wsp, use_tqdm=False)
            dt = time.perf_counter() - t
            rates.append(sum(len(o.outputs[0].token_ids) + len(o.prompt_token_ids)
                             for o in outs) / dt)
        result["workload_tokens_per_s_reps"] = [round(r, 1) for r in rates]
        result["workload_tokens_per_s"] = round(statistics.median(rates), 1)
    if observed:
        after = _scrape(f"http://127.0.0.1:{port}/metrics")
        rank0 = _scrape(f"http://127.0.0.1:{port + 1}/metrics")
        result["kvscope_scheduler"] = {k: v for k, v in after.items() if v != before.get(k, 0)}
        result["kvscope_rank0"] = {k: v for k, v in rank0.items() if v}
        finished = spans.get_finished_spans()
        result["spans"] = {n: sum(1 for s in finished if s.name == n) for n in
                           ("kvscope.lookup_round", "kvscope.promotion", "kvscope.transfer")}
        result["transfer_jobs_rank0"] = sum(
            v for k, v in rank0.items() if k.startswith("kvscope_transfer_seconds_count"))
        if case.get("measure_digest"):  # the promotion's own time vs digesting what it moved
            def series(name: str, direction: str) -> float:
                return sum(v for k, v in {**after, **rank0}.items()
                           if k.startswith(name + "{") and f'"direction":"{direction}"' in k)
            promo_s = series("kvscope_transfer_seconds_sum", "disk_to_cpu")
            promo_b = series("kvscope_transfer_bytes_total", "disk_to_cpu")
            load_s = series("kvscope_transfer_seconds_sum", "cpu_to_gpu")
            row = case["row_bytes"]
            spb = digest_seconds_per_byte(row)
            # measured in the engine (in-process); else estimated from one core's rate:
            # the scheduler side digests each promoted row once, each rank its slot again
            # before the load (TP=1 here: one rank)
            measured = bool(digest_clock.scheduler or digest_clock.rank)
            sched_s = sum(digest_clock.scheduler) if measured else promo_b * spb
            rank_s = sum(digest_clock.rank) if measured else promo_b * spb
            result["checksum_vs_promotion"] = {
                "row_bytes": row, "promoted_bytes": promo_b, "promoted_rows": promo_b / row,
                "promotion_jobs_seconds": round(promo_s, 4),
                "promotion_jobs": series("kvscope_transfer_seconds_count", "disk_to_cpu"),
                "load_jobs_seconds_cpu_to_gpu": round(load_s, 4),
                "digest_GB_per_s": round(1 / spb / 1e9, 2),
                "digest_measured_in_engine": measured,
                "checksum_threads": digest_clock.threads,
                "cpus": len(os.sched_getaffinity(0)),
                "xxhash_version": importlib.metadata.version("xxhash"),
                "scheduler_digest_seconds": round(sched_s, 4),
                "rank_verify_seconds": round(rank_s, 4),
                "scheduler_digest_share_of_promotion": round(sched_s / promo_s, 4)
                if promo_s else None,
                "rank_verify_share_of_promotion": round(rank_s / promo_s, 4)
                if promo_s else None,
                "digest_seconds_scheduler_plus_rank": round(sched_s + rank_s, 4),
                "digest_share_of_promotion": round((sched_s + rank_s) / promo_s, 4)
                if promo_s else None}
        # vLLM's own in-process metrics (export path 1) carry the same kvscope series
        try:  # what vLLM's own in-process metrics (llm.get_metrics) show, for the record
            names = {m.name for m in llm.get_metrics()}
            result["vllm_path_kvscope_series"] = sorted(n for n in names
                                                        if n.startswith("kvscope_"))
            result["vllm_path_offload_series"] = sorted(n for n in names if "offload" in n)
        except Exception as exc:  # record, do not lose the run
            result["vllm_path_kvscope_series"] = repr(exc)
    return result


def case_in_subprocess(name: str) -> dict:
    """One case in a fresh process (vLLM keeps process-wide state): its JSON line, or the
    case with its exit code and the output's tail."""
    proc = subprocess.run([sys.executable, "-m", "kvscope.sim.gpu_e2e_cases", name],
                          capture_output=True, text=True, timeout=540)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"case": name, "error": proc.returncode, "tail": (proc.stdout + proc.stderr)[-3000:]}


if __name__ == "__main__":  # python -m kvscope.sim.gpu_e2e_cases NAME: one case, JSON on stdout
    print(json.dumps(run_case(sys.argv[1]), default=str), flush=True)
