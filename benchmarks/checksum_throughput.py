"""Checksum throughput: xxh3-64 vs crc32 per core, and one promotion's rows over threads.

    python benchmarks/checksum_throughput.py [--sizes 32768 262144 2097152]
    python benchmarks/checksum_throughput.py --batch-rows 125 --threads 1 2 4 8
    python benchmarks/checksum_throughput.py --threads 1 2 4 8 --total-mib 256 \
        --row-bytes 32768 131072 524288 2097152

Without ``--threads``: GB/s of one thread per algorithm and buffer size (one buffer,
hashed again and again: cache-resident for the small sizes). With ``--threads``: the
seconds kvscope's ``Digester`` takes for ``--batch-rows`` distinct rows of
``--row-bytes`` (a 125-row promotion of 2 MiB rows is 250 MiB: from memory, as after a
promotion), per ``checksum_threads`` setting, best of ``--repeats``. With
``--total-mib``: per row size, as many rows as fill that many MiB, cut from one buffer
as the primary tier's rows are (a 131k-token restore of 32 KiB rows is 8,187 of them).
Results in benchmarks/README.md ("Checksum throughput").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from kvscope.connector.integrity.checksums import ALGORITHMS, Digester


def measure(fn, size: int, budget_s: float = 0.5) -> float:
    buf = memoryview(os.urandom(size))
    n, t0 = 0, time.perf_counter()
    while True:
        fn(buf)
        n += 1
        dt = time.perf_counter() - t0
        if dt >= budget_s:
            return n * size / dt / 1e9


def batch_seconds(threads: int, rows: list[memoryview], algorithm: str, repeats: int) -> float:
    d = Digester(algorithm, threads)
    try:
        d.many(rows[:threads])  # start the pool's threads outside the timing
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            d.many(rows)
            best = min(best, time.perf_counter() - t)
        return best
    finally:
        d.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="*", default=[32 << 10, 256 << 10, 2 << 20, 16 << 20])
    p.add_argument("--threads", type=int, nargs="*", default=[])
    p.add_argument("--batch-rows", type=int, default=125)
    p.add_argument("--row-bytes", type=int, nargs="+", default=[2 << 20])
    p.add_argument("--total-mib", type=int, default=None,
                   help="rows of each size cut from one buffer of this many MiB")
    p.add_argument("--algorithm", default="xxh3", choices=sorted(ALGORITHMS))
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    rows: dict = {"cpu": platform.processor() or platform.machine(),
                  "cpus": len(os.sched_getaffinity(0)), "results": []}
    if not args.threads:
        for size in args.sizes:
            for name, fn in ALGORITHMS.items():
                rows["results"].append({"algorithm": name, "bytes": size,
                                        "GB_per_s_per_core": round(measure(fn, size), 2)})
        print(json.dumps(rows, indent=1))
        return
    region = memoryview(os.urandom(args.total_mib << 20)) if args.total_mib else None
    for size in args.row_bytes:
        if region is not None:
            batch = [region[i * size:(i + 1) * size] for i in range(len(region) // size)]
        else:
            batch = [memoryview(os.urandom(size)) for _ in range(args.batch_rows)]
        for k in args.threads:
            s = batch_seconds(k, batch, args.algorithm, args.repeats)
            rows["results"].append({"algorithm": args.algorithm, "threads": k,
                                    "rows": len(batch), "row_bytes": size,
                                    "seconds": round(s, 5),
                                    "GB_per_s": round(len(batch) * size / s / 1e9, 2)})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
