"""The fault campaign on vLLM's real scheduler on CPU, seen the way an operator sees it.

The GPU campaign (``gpu_campaign.py``) lost its server to a vLLM 0.26 bug before the
pending-type faults ran. This runs every fault on the CPU harness
(``kvscope/sim/cpu_engine.py``: vLLM's Scheduler, the observed connector on both sides,
two simulated ranks, the tiering manager with its fs tier) in real time: an engine
loop steps while vLLM has work (as EngineCore does) and idles otherwise; vLLM's own
PrometheusStatLogger fills the /metrics a ``vllm serve`` would expose (job ``vllm``)
and each rank serves its kvscope endpoint (job ``kvscope-rank``); both are recorded
every second as timestamped OpenMetrics, replayed by ``tests/support/campaign_replay.py``.

    python benchmarks/cpu_campaign.py --out tests/fixtures/campaign-cpu
    python benchmarks/cpu_campaign.py --out tests/fixtures/campaign-cpu --only dir_removed

``--only`` runs the named phases alone, as a run of their own (``faults-cpu-<names>``).
kvscope's tier probe checks every ``PROBE_S`` seconds here (5 in production), scaled to
the runs like the replay's rule windows.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_campaign import fill, mount_small_tmpfs  # noqa: E402

from kvscope.exporters import signals  # noqa: E402
from kvscope.sim import faults  # noqa: E402
from kvscope.sim.openmetrics_recording import Recorder, Target  # noqa: E402

TOKENS = 96
FLOODS = 3
PROBE_S = 1.0
# A serving engine keeps serving after its disk tier lost data: a new prompt this often
# while the fault is held (vLLM publishes kvscope's series with its per-step stats).
TRAFFIC_EVERY_S = 2.0


class LiveEngine:
    """A CPUEngine stepped by a thread while vLLM has work, like EngineCore's busy loop."""

    def __init__(self, fs_root: str) -> None:
        from prometheus_client import REGISTRY, start_http_server

        from kvscope.exporters.prometheus import start_exporter
        from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

        self.e = CPUEngine(EngineConfig(rows=12, kv_groups=1, world_size=2, num_gpu_blocks=16,
                                        max_num_batched_tokens=16, vllm_metrics=True,
                                        fs_root=fs_root, step_time_s=0.01, fault_hooks=True,
                                        kvscope_options={"tier_probe_interval_s": PROBE_S,
                                                         # the faults change the shared
                                                         # file in place: every rank digested
                                                         "checksum_scope": "all"}))
        self.server, _ = start_http_server(0, addr="127.0.0.1", registry=REGISTRY)
        self.ranks = [start_exporter([r.connector.kvscope_recorder], 0) for r in self.e.ranks]
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def targets(self) -> list[Target]:
        port = self.server.server_port
        out = [Target(f"http://127.0.0.1:{port}/metrics", "vllm", f"cpu:{port}")]
        for ex in self.ranks:
            out.append(Target(ex.url, "kvscope-rank", ex.url.split("/")[2]))
        return out

    def _loop(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                busy = self.e.scheduler.has_requests()
                if busy:
                    self.e.step()
            if not busy:
                time.sleep(0.01)

    def ask(self, tokens: list[int], max_tokens: int = 4, timeout: float = 60.0):
        with self.lock:
            rid = self.e.add_request(tokens, max_tokens)
        deadline = time.time() + timeout
        while rid not in self.e.finished:
            if time.time() > deadline:
                return None
            time.sleep(0.01)
        return self.e.finished[rid]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for ex in self.ranks:
            ex.close()
        self.server.shutdown()
        self.e.close()


def main() -> int:
    from kvscope.sim.cpu_engine import prompt

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--hold", type=float, default=20.0)
    p.add_argument("--idle", type=float, default=14.0)
    p.add_argument("--only", nargs="+", metavar="PHASE",
                   help="run only these phases (control, a fault name, dir_removed, disk_full)")
    args = p.parse_args()
    phase_names = {"control", *faults.SWITCHABLE, "dir_removed", "disk_full"}
    if args.only and not set(args.only) <= phase_names:
        p.error(f"unknown phases {sorted(set(args.only) - phase_names)}")
    os.makedirs(args.out, exist_ok=True)
    switch = os.path.join(tempfile.mkdtemp(prefix="kvscope-faults-"), "fault.json")
    os.environ[faults.ENV] = switch
    faults.write_fault(switch, None)
    mnt = tempfile.mkdtemp(prefix="kvscope-fs-")
    tmpfs = mount_small_tmpfs(mnt, "8m")
    root = os.path.join(mnt, "kv")
    eng = LiveEngine(root)
    seed = [10]
    phases: list[dict] = []

    def new_prompt():
        seed[0] += 1
        return prompt(seed[0], TOKENS)

    def settle(timeout=30.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with eng.lock:
                busy = eng.e.scheduler.has_requests()
            if not busy:
                return True
            time.sleep(0.05)
        return False

    def ask_flood(target):
        first = eng.ask(target)
        for _ in range(FLOODS):
            eng.ask(new_prompt(), 2)
        settle()
        return first

    def verdict(phase, first, again):
        phase["wrong_tokens"] = (sum(a != b for a, b in zip(first.output, again.output))
                                 if first and again else None)
        phase["restored_tokens"] = again.num_external_tokens if again else None

    def diagnose(phase, *extra):
        r = subprocess.run([sys.executable, "-m", "kvscope.diagnostics.cli", "--scrape",
                            eng.targets()[0].url, "--json", "--interval", "2s", *extra],
                           capture_output=True, text=True, timeout=120)
        try:
            phase["diagnose"] = [v["id"] for v in json.loads(r.stdout)["verdicts"]]
        except (ValueError, KeyError):
            phase["diagnose"] = (r.stdout + r.stderr)[-500:]

    def corrupt(phase, fault=None):
        target = new_prompt()
        first = ask_flood(target)
        if fault:
            faults.write_fault(switch, fault, 1)
            phase["fault_on"] = time.time()
        verdict(phase, first, eng.ask(target))
        diagnose(phase)

    def pending_fault(phase, fault):
        target = new_prompt()
        first = ask_flood(target) if fault == faults.STALL_READS else None
        faults.write_fault(switch, fault, 1)
        phase["fault_on"] = time.time()
        if fault == faults.STALL_READS:  # the re-ask waits (aborting it kills vLLM 0.26)
            with eng.lock:
                rid = eng.e.add_request(target, 4)
        else:
            first = eng.ask(target)
        time.sleep(args.hold)
        diagnose(phase, "--stuck-after", "10s")
        faults.write_fault(switch, None)
        phase["fault_off"] = time.time()
        if fault == faults.STALL_READS:
            while rid not in eng.e.finished:
                time.sleep(0.01)
            verdict(phase, first, eng.e.finished[rid])
        else:
            settle()
            for _ in range(FLOODS):
                eng.ask(new_prompt(), 2)
            settle()
            verdict(phase, first, eng.ask(target))

    def dir_removed(phase):
        target = new_prompt()
        first = ask_flood(target)
        # engine truth: the block files the fs tier holds before the removal
        phase["block_files_before"] = sum(f.endswith(".bin") for _, _, fs in os.walk(root)
                                          for f in fs)
        shutil.rmtree(root, ignore_errors=True)
        phase["fault_on"] = time.time()
        verdict(phase, first, eng.ask(target))
        deadline = time.time() + args.hold
        while time.time() < deadline:  # the engine keeps serving (new prompts, stored anew)
            eng.ask(new_prompt(), 2)
            time.sleep(TRAFFIC_EVERY_S)
        diagnose(phase)
        phase["fault_off"] = time.time()  # the next store recreated the block folders
        snap = eng.e.connector.kvscope_recorder.snapshot()  # kvscope's count, beside the truth
        phase["lost_keys_exported"] = sum(v for (m, _), v in snap.counters.items()
                                          if m is signals.TIER_LOST_KEYS)

    def disk_full(phase):
        ballast = os.path.join(mnt, "ballast")
        phase["ballast_bytes"] = fill(ballast)
        phase["fault_on"] = time.time()
        target = new_prompt()
        first = ask_flood(target)
        verdict(phase, first, eng.ask(target))
        time.sleep(args.hold)
        diagnose(phase)
        os.remove(ballast)
        phase["fault_off"] = time.time()

    plan = [("control", corrupt),
            (faults.FLIP_PROMOTED, lambda ph: corrupt(ph, faults.FLIP_PROMOTED)),
            (faults.DROP_PROMOTION, lambda ph: corrupt(ph, faults.DROP_PROMOTION)),
            (faults.STALL_READS, lambda ph: pending_fault(ph, faults.STALL_READS)),
            (faults.STALL_WRITES, lambda ph: pending_fault(ph, faults.STALL_WRITES)),
            (faults.WITHHOLD_STORE, lambda ph: pending_fault(ph, faults.WITHHOLD_STORE)),
            ("dir_removed", dir_removed)]
    if tmpfs:
        plan.append(("disk_full", disk_full))
    run = "faults-cpu"
    if args.only:
        plan = [(name, body) for name, body in plan if name in args.only]
        run = "faults-cpu-" + "-".join(name for name, _ in plan)
    try:
        with Recorder(eng.targets()) as rec:
            # A baseline: vLLM shows kvscope's series from the first step's stats on, so a
            # short request first, then two scrapes of every target, before the first phase
            # (a counter born holding a phase's events shows no increase() over that phase).
            eng.ask(prompt(1, 16), 1)
            scraped = rec.scrapes
            while rec.scrapes < scraped + 2 * len(eng.targets()):
                time.sleep(0.05)
            for name, body in plan:
                phase = {"name": name, "start": time.time()}
                print(f"== {name}", flush=True)
                try:
                    body(phase)
                except Exception as exc:
                    phase["error"] = repr(exc)
                if "fault_on" in phase:
                    phase.setdefault("fault_off", time.time())
                faults.write_fault(switch, None)
                phase["settled"] = settle()
                time.sleep(args.idle)
                phase["end"] = time.time()
                phases.append(phase)
                print(json.dumps(phase), flush=True)
        rec.recording.write(os.path.join(args.out, f"{run}.om.gz"))
        with open(os.path.join(args.out, f"{run}.json"), "w") as f:
            json.dump({"harness": "cpu_engine", "tmpfs": tmpfs, "phases": phases}, f, indent=1)
    finally:
        eng.close()
        if tmpfs:
            subprocess.run(["umount", mnt], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
