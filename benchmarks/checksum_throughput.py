"""Checksum throughput per core: xxh3-64 vs crc32 over row-slot-sized buffers.

    python benchmarks/checksum_throughput.py [--sizes 32768 262144 2097152]

Prints GB/s (single thread) per algorithm and size; results in
benchmarks/results/checksum_throughput.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from kvscope.connector.checksums import ALGORITHMS


def measure(fn, size: int, budget_s: float = 0.5) -> float:
    buf = memoryview(os.urandom(size))
    n, t0 = 0, time.perf_counter()
    while True:
        fn(buf)
        n += 1
        dt = time.perf_counter() - t0
        if dt >= budget_s:
            return n * size / dt / 1e9


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="*", default=[32 << 10, 256 << 10, 2 << 20, 16 << 20])
    args = p.parse_args()
    rows = {"cpu": platform.processor() or platform.machine(), "results": []}
    for size in args.sizes:
        for name, fn in ALGORITHMS.items():
            rows["results"].append({"algorithm": name, "bytes": size,
                                    "GB_per_s_per_core": round(measure(fn, size), 2)})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
