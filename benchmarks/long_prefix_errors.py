"""A long prefix restored from disk through tiering on vLLM's scheduler on CPU, and whether
kvscope counted any telemetry error doing it (issue 26: on the H200 a 131k-token restore made
``kvscope_telemetry_errors_total{where="aggregator"}`` rise). Asks a prompt of N tokens,
floods it out of the GPU blocks and the primary tier with two more, re-asks it (promoted
from the fs tier, racing the steps as beside a real engine), and prints the re-ask's
restored tokens (vLLM's ``num_cached_tokens``), kvscope's error counter per site and its
lookup counts.

    FSROOT=/disk/dir python benchmarks/long_prefix_errors.py 500000 32000   # tokens, rows
"""

from __future__ import annotations

import os
import random
import sys
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def prompt(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1, 30000) for _ in range(n)]


def main() -> None:
    from kvscope.exporters import signals
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 131_000
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 9000
    cfg = EngineConfig(rows=rows, tiering=True, num_gpu_blocks=n // 16 + 200,
                       max_num_batched_tokens=8192, max_num_seqs=4, max_model_len=n + 64,
                       settle_tiers=False, fs_root=os.environ.get("FSROOT"))
    with CPUEngine(cfg) as e:
        for seed, what in ((0, "ask"), (1, "flood 1"), (2, "flood 2")):
            t = time.time()
            e.generate(prompt(seed, n), 4, max_steps=100_000)
            print(what, round(time.time() - t, 1), "s, steps", e.steps, flush=True)
        s0, t = e.steps, time.time()
        rid = e.add_request(prompt(0, n), 4)
        e.run_until_done([rid], max_steps=100_000)
        print("reask", round(time.time() - t, 1), "s, steps", e.steps - s0, "restored",
              e.finished[rid].num_cached_tokens, flush=True)
        e.drain()
        rec = e.connector._kvscope_observer.rec
        print("errors", {w.value: rec.value(signals.TELEMETRY_ERRORS, (w.value,))
                         for w in signals.ErrorSite})
        print("lookups", {r.value: rec.value(signals.LOOKUPS, ("0", r.value))
                          for r in signals.LookupResult})


if __name__ == "__main__":
    main()
