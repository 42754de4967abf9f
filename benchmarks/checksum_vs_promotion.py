"""Promoted-row verification against the promotion's own time, on CPU, 2 MiB rows.

    python benchmarks/checksum_vs_promotion.py [--rows 32] [--threads 1 2] [--world-size 1]

vLLM's real scheduler and tiering manager (fs tier on disk, CPU tier in /dev/shm) in
the CPU harness (``kvscope.sim.cpu_engine``), shaped so one row is 2 MiB per rank as
for an 8B model at TP=1 (16-token blocks x 32 layers x K,V x 8 KV heads x 128 x bf16):
here 256-token blocks x 64 layers x K,V x the harness's 2 KV heads x 16 x fp16. A
prompt of ``--rows`` rows is asked, flooded out of the GPU prefix cache and the CPU
tier by two others, and asked again: its rows come back from disk in one promotion,
verified on the scheduler side (``PromotedRows.digest_promoted``, on the scheduler
thread, when the promotion completes) and on each rank before the load
(``WorkerProxy._verify``). For each ``checksum_threads`` setting, a fresh engine:

* the promotion's own time: the fs tier's read tasks, from the job handed to its
  I/O threads to its last row read (wrapping the tier's thread pool instance);
* wall seconds of the scheduler-side digests and of each rank's verification (kvscope's
  own objects, wrapped per instance), their share of the promotion's time, and the
  scheduler-side digests' share of the scheduler thread's CPU time during the re-ask;
* engine truth: tokens restored, the output against the first answer, rows verified.

One JSON line per setting on stdout, then a summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from typing import Any

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

BLOCK = 256
LAYERS = 64  # x 32 KiB (256 tokens x K,V x 2 heads x 16 dims x fp16) = 2 MiB per row


def _timed(obj: Any, name: str, spent: list[float], thread_cpu: list[float] | None = None):
    """Wrap ``obj.name`` (instance attribute): wall seconds (and thread CPU) into the lists."""
    inner = getattr(obj, name)

    def wrapper(*a, **kw):
        t, c = time.perf_counter(), time.thread_time()
        try:
            return inner(*a, **kw)
        finally:
            spent.append(time.perf_counter() - t)
            if thread_cpu is not None:
                thread_cpu.append(time.thread_time() - c)

    setattr(obj, name, wrapper)


class PromotionClock:
    """The fs tier's promotions: from the job reaching the I/O threads to its last read."""

    def __init__(self, pool: Any) -> None:
        self.jobs: list[dict] = []
        submit = pool.enqueue_load

        def enqueue_load(job_id, n_tasks, tasks):
            rec = {"rows": n_tasks, "start": time.perf_counter(), "end": 0.0}
            lock = threading.Lock()

            def timed(task):
                def run():
                    try:
                        return task()
                    finally:
                        with lock:
                            rec["end"] = max(rec["end"], time.perf_counter())
                return run

            self.jobs.append(rec)
            return submit(job_id, n_tasks, [timed(t) for t in tasks])

        pool.enqueue_load = enqueue_load

    def seconds(self) -> float:
        return sum(j["end"] - j["start"] for j in self.jobs if j["end"])


def run(rows: int, threads: int | None, world_size: int) -> dict:
    tokens = rows * BLOCK
    cfg = EngineConfig(rows=rows + 8, world_size=world_size, num_layers=LAYERS,
                       block_size=BLOCK, num_gpu_blocks=rows + 8,
                       max_num_batched_tokens=4 * BLOCK, max_model_len=tokens + BLOCK,
                       kvscope_options={"checksum_threads": threads,
                                        # one process: every rank shares the scheduler's
                                        # file; "all" digests them, as a multi-node rank is
                                        "checksum_scope": "all"})
    with CPUEngine(cfg) as e:
        assert e.row_bytes == world_size * (2 << 20), e.row_bytes
        target = prompt(1, tokens)
        first = e.generate(target, 4, max_steps=2000)
        e.drain()
        for seed in (2, 3):  # out of the GPU prefix cache and the CPU tier: on disk only
            e.generate(prompt(seed, tokens), 2, max_steps=2000)
            e.drain()
        observer = e.connector._kvscope_observer
        sched_wall: list[float] = []
        sched_cpu: list[float] = []
        _timed(observer.rows, "digest_promoted", sched_wall, sched_cpu)
        rank_wall = {r.rank: [] for r in e.ranks}
        for r in e.ranks:
            _timed(r.connector.kvscope_worker, "_verify", rank_wall[r.rank])
        clocks = [PromotionClock(pool) for pool in e._tier_pools()]
        cpu_before = e.scheduler_seconds
        t = time.perf_counter()
        again = e.generate(target, 4, max_steps=2000)
        reask_s = time.perf_counter() - t
        e.drain()
        sched_thread_cpu = e.scheduler_seconds - cpu_before
        rec = [r.connector.kvscope_recorder for r in e.ranks]
        promo_s = sum(c.seconds() for c in clocks)
        promoted_rows = sum(j["rows"] for c in clocks for j in c.jobs)
        digest_threads = observer.rows.digester.threads
        matched = {r.rank: _row_checksums(rec[r.rank], str(r.rank)) for r in e.ranks}
    sched_s = sum(sched_wall)
    rank_s = {k: sum(v) for k, v in rank_wall.items()}
    return {
        "checksum_threads": digest_threads, "world_size": world_size,
        "row_bytes": world_size * (2 << 20), "rows_per_prompt": rows,
        "promotion_jobs": sum(len(c.jobs) for c in clocks), "promoted_rows": promoted_rows,
        "promotion_seconds": round(promo_s, 4),
        "scheduler_digest_seconds": round(sched_s, 4),
        "scheduler_digest_share_of_promotion": round(sched_s / promo_s, 4) if promo_s else None,
        "rank_verify_seconds": {str(k): round(v, 4) for k, v in rank_s.items()},
        "rank_verify_share_of_promotion": {str(k): round(v / promo_s, 4) if promo_s else None
                                           for k, v in rank_s.items()},
        "digest_share_of_promotion_both_sides": round((sched_s + max(rank_s.values())) / promo_s,
                                                      4) if promo_s else None,
        # CPU time of the scheduler thread inside schedule() + update_from_output() during
        # the re-ask, and how much of it the scheduler-side digests took
        "scheduler_thread_cpu_seconds": round(sched_thread_cpu, 4),
        "scheduler_digest_thread_cpu_seconds": round(sum(sched_cpu), 4),
        "reask_seconds": round(reask_s, 3),
        "restored_tokens": again.num_external_tokens, "prompt_tokens": tokens,
        "same_output": again.output == first.output,
        "row_checksums": matched,
    }


def _row_checksums(rec: Any, rank: str) -> dict:
    from kvscope.exporters import signals as S

    return {o.value: rec.value(S.ROW_CHECKSUMS, (rank, o.value)) for o in S.ChecksumOutcome}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=32, help="rows (2 MiB each) in the promotion")
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2],
                   help="checksum_threads settings to compare (0: automatic)")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    results = []
    for _ in range(args.repeats):  # alternate the settings, so drift hits each alike
        for k in args.threads:
            r = run(args.rows, k or None, args.world_size)
            results.append(r)
            print(json.dumps(r), flush=True)
    summary: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                     "python": platform.python_version(), "by_threads": {}}
    for k in sorted({r["checksum_threads"] for r in results}):
        mine = [r for r in results if r["checksum_threads"] == k]

        def med(key: str, mine: list[dict] = mine) -> float:
            return statistics.median(r[key] for r in mine)

        summary["by_threads"][str(k)] = {
            "runs": len(mine), "median_promotion_seconds": med("promotion_seconds"),
            "median_scheduler_digest_share": med("scheduler_digest_share_of_promotion"),
            "median_both_sides_share": med("digest_share_of_promotion_both_sides"),
            "all_restored_and_same": all(r["same_output"] and
                                         r["restored_tokens"] == r["prompt_tokens"]
                                         for r in mine)}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
