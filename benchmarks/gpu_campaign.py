"""Fault campaign on two GPUs through `vllm serve`, seen the way an operator sees it.

Runs on a 2-GPU machine (``benchmarks/README.md`` has the commands). Each
server is ``vllm serve`` (engine core in its own process, TP=2) with
``FaultInjectingConnector`` (kvscope's connector with the test fault hooks), tiering + fs tier, ``kv_load_failure_policy=recompute``.
An OpenAI-compatible client (urllib on loopback) drives it; vLLM's ``/metrics`` and
both ranks' kvscope endpoints are recorded every second as timestamped OpenMetrics.

* ``faults``: one server, ``checksum_policy=refuse``; a clean control phase, then one
  fault per phase, switched at run time through ``KVSCOPE_FAULT_FILE``
  (``kvscope/sim/faults.py``; the fs-tier faults are done to the directory itself).
* ``stale-rows --policy observe|refuse``: rank 1 maps its own offload region
  (``OwnRegionTieringSpec``), as a second node's ``/dev/shm`` would be.

Engine truth, per phase: each target prompt is asked fresh (reference tokens), the GPU
and CPU tiers are flooded, and it is asked again; ``wrong_tokens`` compares the two
texts (greedy, word-level tokenizer: one word per token); ``cached_tokens`` is vLLM's
own ``usage.prompt_tokens_details.cached_tokens`` of the re-ask. Each served continuation
is also recomputed teacher-forced, from no cache (``teacher_forced.py``): ``tf_wrong_tokens``
counts served tokens beyond a bf16 near-tie of the recompute's top-1, and
``first_divergence`` says how far apart the two serves' words were where they differ. The
``restore_twin`` phase asks the stall_reads prompt again, salted, restored with no fault.
kv-diagnose runs live against the endpoints at the end of each phase.

    python3 benchmarks/gpu_campaign.py faults --out DIR
    python3 benchmarks/gpu_campaign.py stale-rows --policy observe --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from kvscope.exporters import signals
from kvscope.sim import faults
from kvscope.sim import teacher_forced as tf
from kvscope.sim.gpu_e2e_cases import make_model, text
from kvscope.sim.openmetrics_recording import Recorder, Target

BLOCK = 16
ROW_BYTES = 32 * 1024  # the tiny Llama's KV per 16-token block, both ranks together
# 1504 words = 1504 prompt ids (the served prompts carry no BOS: the recorded usage says 1504),
# 94 full blocks, and at most 15 new tokens: no block fills after the prefill. vLLM 0.26's
# tiering manager forgets a finished request whose stores are done, then builds the store of a
# block its last tokens filled: KeyError in prepare_store, EngineCore dead (seen on the first
# GPU run, benchmarks/README.md).
PROMPT_WORDS = 1504
MAX_TOKENS = 8
FLOODS = 4
READY_TIMEOUT_S = 400.0  # --ready-timeout
PROBE_S = 1.0  # kvscope's tier probe interval here (5 s in production), as in cpu_campaign.py
FAULT_RANK = 1  # the rank a switched fault hits: --fault-rank (default: 1, or 0 with --tp 1)


class Server:
    def __init__(self, out: str, name: str, port: int, extra: dict, env: dict,
                 max_batched: int | None = None, tp: int = 2) -> None:
        self.out, self.name, self.port, self.tp = out, name, port, tp
        self.model = tempfile.mkdtemp(prefix="kvscope-model-")
        make_model(self.model)
        self.kv_port = port + 100
        extra = {**extra, "kvscope": {**extra.get("kvscope", {}), "exporter_port": self.kv_port}}
        # kvscope's connector with the test fault hooks (inert without KVSCOPE_FAULT_FILE)
        ktc = {"kv_connector": "FaultInjectingConnector",
               "kv_connector_module_path": "kvscope.sim.fault_connector", "kv_role": "kv_both",
               "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", self.model,
               "--port", str(port), "--host", "127.0.0.1", "--served-model-name", "tiny",
               "--tensor-parallel-size", str(tp), "--dtype", "bfloat16", "--enforce-eager",
               "--block-size", str(BLOCK), "--num-gpu-blocks-override", "200",
               "--max-model-len", "2048", "--gpu-memory-utilization", "0.3",
               "--max-num-seqs", "8", "--enable-prefix-caching", "--enable-prompt-tokens-details",
               "--no-async-scheduling",  # fewer moving parts; see PROMPT_WORDS for the crash
               "--kv-transfer-config", json.dumps(ktc)]
        if max_batched:  # chunked prefill: store jobs of max_batched / 16 rows
            cmd += ["--max-num-batched-tokens", str(max_batched)]
        self.log = open(os.path.join(out, f"{name}-server.log"), "w")
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "PYTHONHASHSEED": "0",
               "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", **env}
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=False)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def targets(self) -> list[Target]:
        inst = lambda p: f"gpu:{p}"  # noqa: E731
        return [Target(f"{self.base}/metrics", "vllm", inst(self.port))] + [
            Target(f"http://127.0.0.1:{self.kv_port + 1 + r}/metrics", "kvscope-rank",
                   inst(self.kv_port + 1 + r)) for r in range(self.tp)]

    def scrape_urls(self) -> list[str]:  # the scheduler's endpoint, then one per rank
        return [f"http://127.0.0.1:{self.kv_port + k}/metrics" for k in range(self.tp + 1)]

    def wait_ready(self, timeout: float | None = None) -> float:
        deadline = time.time() + (READY_TIMEOUT_S if timeout is None else timeout)
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: server exited {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=2) as r:
                    if r.status == 200:
                        return round(time.time() - self.t0, 1)
            except Exception:
                pass
            time.sleep(1)
        raise TimeoutError(f"{self.name}: not ready after {timeout}s")

    def _post(self, body: dict, timeout: float) -> tuple[dict | None, dict]:
        req = urllib.request.Request(f"{self.base}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t = time.time()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                out = json.loads(r.read())
        except (TimeoutError, urllib.error.URLError) as exc:
            return None, {"error": repr(exc), "seconds": round(time.time() - t, 2)}
        details = (out.get("usage") or {}).get("prompt_tokens_details") or {}
        return out["choices"][0], {"seconds": round(time.time() - t, 2),
                                   "cached_tokens": details.get("cached_tokens")}

    def complete(self, prompt: str, max_tokens: int = MAX_TOKENS, timeout: float = 120,
                 salt: str | None = None, ids: bool = False) -> dict:
        """Greedy completion; ``ids``: also the prompt and served token ids and the serve's
        own top logprobs (what a teacher-forced recompute needs)."""
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0.0, "ignore_eos": True}
        if salt:
            body["cache_salt"] = salt
        if ids:
            body.update(return_token_ids=True, logprobs=tf.TOP_LOGPROBS)
        choice, res = self._post(body, timeout)
        if choice is None:
            return res
        res["text"] = choice["text"]
        if ids:
            res.update(prompt_token_ids=choice.get("prompt_token_ids"),
                       token_ids=choice.get("token_ids"),
                       top_logprobs=(choice.get("logprobs") or {}).get("top_logprobs"))
        return res

    def teacher_forced(self, served: dict, timeout: float = 120) -> dict | None:
        """Recompute ``served``'s continuation with prompt_logprobs, nothing cached
        (``teacher_forced.py``), and judge each served token against its top-1."""
        if not served.get("token_ids") or not served.get("prompt_token_ids"):
            return None
        prompt_ids, served_ids = served["prompt_token_ids"], served["token_ids"]
        choice, res = self._post(tf.recompute_body("tiny", prompt_ids, served_ids), timeout)
        if choice is None:
            return res
        raw = tf.served_positions(choice, len(prompt_ids), len(served_ids))
        return {**tf.judge(served_ids, raw), "recompute_cached_tokens": res["cached_tokens"],
                "seconds": res["seconds"], "raw": raw}  # raw: re-judged in tests

    def kvscope(self) -> dict[str, float]:
        """Scheduler-side kvscope gauges now (standalone endpoint)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"http://127.0.0.1:{self.kv_port}/metrics", timeout=5) as r:
            body = r.read().decode()
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()))
                out[key] = s.value
        return out

    def pending(self) -> float:
        return sum(v for k, v in self.kvscope().items() if k.startswith("kvscope_pending_transfers,"))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.model, ignore_errors=True)


def diagnose(urls: list[str], *extra: str) -> dict:
    cmd = [sys.executable, "-m", "kvscope.diagnostics.cli", "--scrape", *urls, "--json",
           "--interval", "2s", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    try:
        report = json.loads(p.stdout)
    except ValueError:
        return {"exit": p.returncode, "error": (p.stdout + p.stderr)[-1500:]}
    return {"exit": p.returncode, "status": report.get("status"),
            "verdicts": [v.get("id") for v in report.get("verdicts", [])], "report": report}


class Campaign:
    def __init__(self, server: Server, out: str, seed0: int) -> None:
        self.s, self.out, self.seed = server, out, seed0
        self.phases: list[dict] = []
        self.targets: dict[str, str] = {}  # phase -> its target prompt (restore_twin)

    def new_prompt(self) -> str:
        self.seed += 1
        return text(self.seed, PROMPT_WORDS)

    def ask_flood(self, target: str, salt: str | None = None) -> dict:
        first = self.s.complete(target, salt=salt, ids=True)
        for _ in range(FLOODS):
            self.s.complete(self.new_prompt(), max_tokens=2)
        self.settle()
        return first

    def settle(self, timeout: float = 30) -> bool:
        """Nudge the engine (a tiny request steps it) until nothing is pending."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.s.pending() == 0:
                return True
            self.s.complete("w1 w2 w3", max_tokens=1, timeout=30)
            time.sleep(0.5)
        return False

    def verdict(self, phase: dict, first: dict, again: dict) -> None:
        phase["first"] = first
        phase["again"] = again
        ok = "text" in first and "text" in again
        phase["wrong_tokens"] = (sum(a != b for a, b in zip(first["text"].split(),
                                                             again["text"].split()))
                                 if ok else None)
        phase["cached_tokens"] = again.get("cached_tokens")
        # engine truth beyond first == again: each served continuation against a fresh
        # teacher-forced recompute of itself (a near-tie vs a token far from top-1)
        judged = {k: self.s.teacher_forced(v) if "text" in v else None
                  for k, v in (("first", first), ("again", again))}
        phase["teacher_forced"] = judged
        phase["tf_wrong_tokens"] = (sum(j.get("wrong", 0) + (j["verdict"] == "missing")
                                        for j in judged.values())
                                    if all(j and "verdict" in j for j in judged.values())
                                    else None)
        phase["first_divergence"] = (tf.first_divergence(first, again, judged["first"],
                                                         judged["again"]) if ok else None)

    def run(self, name: str, body, idle_after: float) -> None:
        phase = {"name": name, "start": time.time()}
        print(f"== phase {name}", flush=True)
        try:
            body(phase)
        except Exception as exc:  # record and go on with the next phase
            phase["error"] = repr(exc)
        if "fault_on" in phase:
            phase.setdefault("fault_off", time.time())
        faults_off(self.out)
        try:
            phase["settled"] = self.settle(60)
            phase["pending_after"] = self.s.pending()
        except Exception as exc:
            phase["error_after"] = repr(exc)
        time.sleep(idle_after)
        phase["end"] = time.time()
        self.phases.append(phase)
        print(json.dumps({k: v for k, v in phase.items() if k != "diagnose"}, default=str)[:900],
              flush=True)


def fault_file(out: str) -> str:
    return os.path.join(out, "fault.json")


def faults_on(out: str, fault: str, rank: int | None = None) -> None:
    faults.write_fault(fault_file(out), fault, FAULT_RANK if rank is None else rank)


def faults_off(out: str) -> None:
    faults.write_fault(fault_file(out), None)


def mount_small_tmpfs(path: str, size: str) -> bool:
    os.makedirs(path, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                          capture_output=True).returncode == 0


def fill(path: str) -> int:
    """Write a ballast file until the filesystem is full; returns bytes written."""
    n, chunk = 0, b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                n += f.write(chunk)
        except OSError:
            pass
    return n


def run_faults(args, result: dict) -> None:
    out = args.out
    faults_off(out)
    mnt = os.path.join(tempfile.gettempdir(), "kvscope-fs")
    tmpfs = mount_small_tmpfs(mnt, args.tmpfs_size)
    root = os.path.join(mnt, "kv")
    extra = {"cpu_bytes_to_use": args.rows * ROW_BYTES, "block_size": BLOCK,
             "spec_name": "TieringOffloadingSpec",
             "secondary_tiers": [{"type": "fs", "root_dir": root, "n_read_threads": 4,
                                  "n_write_threads": 4}],
             # the tier probe every second, scaled to the runs like the replay's windows
             "kvscope": {"checksum_policy": "refuse", "tier_probe_interval_s": PROBE_S,
                         # flip/drop_promotion change one host's file in place: every rank
                         # digested, also those sharing the scheduler's file
                         "checksum_scope": "all"}}
    s = Server(out, "faults", args.port, extra, {faults.ENV: fault_file(out)}, args.max_batched,
               args.tp)
    result.update(tmpfs=tmpfs, rows=args.rows, max_batched=args.max_batched, tp=args.tp,
                  fault_rank=FAULT_RANK)
    hold, idle = args.hold, args.idle
    try:
        result["engine_up_s"] = s.wait_ready()
        c = Campaign(s, out, 1000)
        with Recorder(s.targets()) as rec:
            def ask_flood_ask(phase, fault=None):
                target = c.new_prompt()
                first = c.ask_flood(target)
                if fault:
                    faults_on(out, fault)
                    phase["fault_on"] = time.time()
                c.verdict(phase, first, s.complete(target, ids=True))
                phase["diagnose"] = diagnose(s.scrape_urls())

            def stall(phase, fault):
                target = c.targets[fault] = c.new_prompt()
                first = c.ask_flood(target) if fault == faults.STALL_READS else None
                faults_on(out, fault)
                phase["fault_on"] = time.time()
                waiting: dict = {}
                if fault == faults.STALL_READS:
                    # the re-ask waits for a promotion that stalls. Not aborted: an abort while
                    # a request waits for a promotion kills vLLM 0.26's scheduler (it ended the
                    # first campaign's server; tests/connector/test_vllm_026_limits.py)
                    asker = threading.Thread(target=lambda: waiting.update(s.complete(target, ids=True)))
                    asker.start()
                elif fault == faults.STALL_WRITES:
                    first = s.complete(target, ids=True)  # its cascade to disk stalls
                else:  # withhold_store: FAULT_RANK does not report this request's store
                    first = s.complete(target, ids=True)
                time.sleep(hold)
                phase["pending_during"] = s.pending()
                phase["diagnose"] = diagnose(s.scrape_urls(), "--stuck-after", "10s")
                faults_off(out)
                phase["fault_off"] = time.time()
                if fault == faults.STALL_READS:
                    asker.join(120)
                    c.verdict(phase, first, waiting)  # the waiting re-ask, served once cleared
                phase["settled_after_clear"] = c.settle(60)
                if fault != faults.STALL_READS:
                    for _ in range(FLOODS):
                        s.complete(c.new_prompt(), max_tokens=2)
                    c.settle()
                    c.verdict(phase, first, s.complete(target, ids=True))

            def restore_twin(phase):
                # the stall_reads target again, restored WITHOUT a stall: a fresh cache_salt
                # gives it its own block hashes (fresh first ask, own tier entries), the same
                # compute paths as there (chunked prefill, then the last token alone over
                # restored KV)
                target = c.targets.get(faults.STALL_READS) or c.new_prompt()
                phase["twin_of"] = faults.STALL_READS if faults.STALL_READS in c.targets else None
                first = c.ask_flood(target, salt="restore-twin")
                c.verdict(phase, first, s.complete(target, salt="restore-twin", ids=True))

            def dir_removed(phase):
                target = c.new_prompt()
                first = c.ask_flood(target)
                # engine truth: the block files the fs tier holds before the removal
                phase["block_files_before"] = sum(f.endswith(".bin") for _, _, fs in os.walk(root)
                                                  for f in fs)
                shutil.rmtree(root, ignore_errors=True)
                phase["fault_on"] = time.time()
                phase["removed"] = not os.path.exists(root)
                c.verdict(phase, first, s.complete(target, ids=True))
                deadline = time.time() + hold
                while time.time() < deadline:  # the engine keeps serving (stored anew)
                    s.complete(c.new_prompt(), max_tokens=2)
                    time.sleep(2.0)
                phase["diagnose"] = diagnose(s.scrape_urls())
                phase["fault_off"] = time.time()  # later stores recreated the block folders
                phase["lost_keys_exported"] = sum(
                    v for k, v in s.kvscope().items()
                    if k.startswith(f"{signals.TIER_LOST_KEYS.name},"))

            def disk_full(phase):
                ballast = os.path.join(mnt, "ballast")
                phase["ballast_bytes"] = fill(ballast)
                phase["fault_on"] = time.time()
                target = c.new_prompt()
                first = c.ask_flood(target)
                c.verdict(phase, first, s.complete(target, ids=True))
                time.sleep(hold)
                phase["diagnose"] = diagnose(s.scrape_urls())
                os.remove(ballast)
                phase["fault_off"] = time.time()

            plan = [("control", ask_flood_ask),
                    (faults.FLIP_PROMOTED, lambda p: ask_flood_ask(p, faults.FLIP_PROMOTED)),
                    (faults.DROP_PROMOTION, lambda p: ask_flood_ask(p, faults.DROP_PROMOTION)),
                    (faults.STALL_READS, lambda p: stall(p, faults.STALL_READS)),
                    ("restore_twin", restore_twin),
                    (faults.STALL_WRITES, lambda p: stall(p, faults.STALL_WRITES)),
                    (faults.WITHHOLD_STORE, lambda p: stall(p, faults.WITHHOLD_STORE)),
                    ("dir_removed", dir_removed)]
            if tmpfs:
                plan.append(("disk_full", disk_full))
            deadline = time.time() + args.budget
            for name, body in plan:
                if args.only and name not in args.only:
                    continue
                if time.time() > deadline:
                    c.phases.append({"name": name, "skipped": "time budget"})
                    continue
                c.run(name, body, idle)
                rec.recording.write(os.path.join(out, "faults.om.gz"))
        rec.recording.write(os.path.join(out, "faults.om.gz"))
        result.update(phases=c.phases, scrapes=rec.scrapes, scrape_failures=rec.failures)
    finally:
        result.setdefault("phases", c.phases if "c" in locals() else [])
        s.stop()
        if tmpfs:
            subprocess.run(["umount", mnt], capture_output=True)


def run_stale_rows(args, result: dict) -> None:
    out = args.out
    root = os.path.join(out, "..", f"fs-stale-{args.policy}")
    extra = {"cpu_bytes_to_use": args.rows * ROW_BYTES, "block_size": BLOCK,
             "spec_name": "OwnRegionTieringSpec",
             "spec_module_path": "kvscope.sim.faults",
             faults.OWN_REGION_KEY: [1],
             "secondary_tiers": [{"type": "fs", "root_dir": root, "n_read_threads": 4,
                                  "n_write_threads": 4}],
             "kvscope": {"checksum_policy": args.policy}}
    name = f"stale-rows-{args.policy}"
    s = Server(out, name, args.port, extra, {}, args.max_batched, args.tp)
    result.update(policy=args.policy, rows=args.rows, max_batched=args.max_batched)
    try:
        result["engine_up_s"] = s.wait_ready()
        c = Campaign(s, out, 5000)
        with Recorder(s.targets()) as rec:
            def body(phase):
                phase["asks"] = []
                for _ in range(2):
                    target = c.new_prompt()
                    first = c.ask_flood(target)
                    p: dict = {}
                    c.verdict(p, first, s.complete(target, ids=True))
                    phase["asks"].append(p)
                phase["wrong_tokens"] = sum(p["wrong_tokens"] or 0 for p in phase["asks"])
                phase["diagnose"] = diagnose(s.scrape_urls())
            c.run(name, body, args.idle)
            rec.recording.write(os.path.join(out, f"{name}.om.gz"))
        result.update(phases=c.phases, scrapes=rec.scrapes, scrape_failures=rec.failures)
        result["kvscope_scheduler_final"] = {k: v for k, v in s.kvscope().items()
                                             if v and "bucket" not in k}
    finally:
        result.setdefault("phases", c.phases if "c" in locals() else [])
        s.stop()


def main() -> int:
    global FAULT_RANK, READY_TIMEOUT_S
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["faults", "stale-rows"])
    p.add_argument("--out", required=True)
    p.add_argument("--policy", default="refuse", choices=["observe", "refuse"])
    p.add_argument("--port", type=int, default=8000)
    # 200 rows and 512-token chunks: every store job finds rows. With 100 rows and whole-prompt
    # prefills a store found none ("cannot store chunks") and vLLM 0.26 died (README).
    p.add_argument("--rows", type=int, default=200)
    p.add_argument("--max-batched", type=int, default=512, help="--max-num-batched-tokens")
    p.add_argument("--hold", type=float, default=22.0, help="seconds a fault's state is held")
    p.add_argument("--idle", type=float, default=15.0, help="idle seconds after each phase")
    p.add_argument("--tmpfs-size", default="512m")
    p.add_argument("--budget", type=float, default=380.0, help="no new phase after this (s)")
    p.add_argument("--only", nargs="*")
    p.add_argument("--tp", type=int, default=2, help="--tensor-parallel-size (1: one GPU)")
    p.add_argument("--fault-rank", type=int, help="rank a switched fault hits (default 1; 0 at TP=1)")
    p.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S)
    args = p.parse_args()
    FAULT_RANK = args.fault_rank if args.fault_rank is not None else min(1, args.tp - 1)
    READY_TIMEOUT_S = args.ready_timeout
    os.makedirs(args.out, exist_ok=True)
    t = time.time()
    fn = run_faults if args.what == "faults" else run_stale_rows
    result: dict = {}
    try:
        fn(args, result)
    except Exception as exc:  # keep what was measured
        result["error"] = repr(exc)
    result["wall_s"] = round(time.time() - t, 1)
    name = "faults" if args.what == "faults" else f"stale-rows-{args.policy}"
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(json.dumps({k: v for k, v in result.items() if k != "phases"}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
