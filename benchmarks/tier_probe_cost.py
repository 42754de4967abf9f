"""What kvscope's tier probe costs: one check (its turn of the sample), on the real fs tier.

The probe (``connector/tier_probe.py``) runs on its own daemon thread; the scheduler
thread only appends each completed cascade job's keys to a deque. Its cost to vLLM is the
GIL time of its ``os.stat`` calls: ``CHECK_KEYS`` (128) of its ``SAMPLE_KEYS`` (1,024) per
check, in turn, and one per newly written key on intake. This builds the CPU harness's
engine (vLLM's fs tier, its real file mapper), writes a block file for each of 1,024 keys
where the tier would, hands the keys to the probe as the cascade tap does, and times the
intake and the checks (wall and thread CPU time), then the checks after the directory is
removed (every key lost) until the whole sample is counted. Not a test.

    python benchmarks/tier_probe_cost.py [--root DIR] [--repeat 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque

from vllm.v1.kv_offload.base import make_offload_key

from kvscope.connector.tier_probe import SAMPLE_KEYS, TierProbe
from kvscope.exporters import signals
from kvscope.exporters.recorder import Recorder
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig


def timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - w, time.thread_time() - c


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--root", help="the fs tier's root_dir (default: a temp dir)")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--out")
    args = p.parse_args()
    root = args.root or os.path.join(tempfile.mkdtemp(prefix="kvscope-probe-"), "fs")
    e = CPUEngine(EngineConfig(rows=12, fs_root=root,
                               kvscope_options={"tier_probe_interval_s": 0}))
    try:
        (tier,) = e.connector._kvscope_observer.tiers
        keys = [make_offload_key(os.urandom(32), 0) for _ in range(SAMPLE_KEYS)]
        for key in keys:  # a block file where the tier writes it (4 KiB, as a small block)
            path = tier.file_mapper.get_file_name(key)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(b"\0" * 4096)
        rec = Recorder()
        # never started: the passes below are called here, timed
        probe = TierProbe(recorder=rec, tiers=[tier], written=deque(), interval_s=5.0)
        tier_name = next(iter(probe.tiers))
        for i in range(0, len(keys), 6):  # jobs of 6 keys (a 96-token prompt's chunks)
            probe.written.append((tier_name, keys[i:i + 6]))
        intake = timed(probe.intake)
        checks = [timed(probe.probe) for _ in range(args.repeat)]
        assert rec.value(signals.TIER_LOST_KEYS, (tier_name,)) == 0
        shutil.rmtree(root)
        turns = -(-len(keys) // probe.check_keys)  # checks to go round the sample once
        lost = [timed(probe.probe) for _ in range(turns)]
        assert rec.value(signals.TIER_LOST_KEYS, (tier_name,)) == len(keys)
    finally:
        e.close()
    out = {
        "keys": len(keys),
        "check_keys": probe.check_keys,
        "fs": os.popen(f"stat -f -c %T {os.path.dirname(root)}").read().strip(),
        "intake_wall_ms": round(intake[0] * 1e3, 3),
        "intake_cpu_ms": round(intake[1] * 1e3, 3),
        "check_wall_ms_median": round(statistics.median(w for w, _ in checks) * 1e3, 3),
        "check_cpu_ms_median": round(statistics.median(c for _, c in checks) * 1e3, 3),
        "check_all_lost_wall_ms": round(statistics.median(w for w, _ in lost) * 1e3, 3),
        "checks_to_count_all_lost": len(lost),
        "repeat": args.repeat,
        "python": sys.version.split()[0],
    }
    print(json.dumps(out))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
