"""Digests of rank slots of primary-tier rows.

A promotion (disk -> CPU) writes whole rows into the scheduler host's shared
region. On a multi-node TP deployment the other nodes' regions never see those
bytes. The scheduler side digests each rank's slot of a promoted row when the
promotion completes; before a CPU -> GPU load, each rank digests its own slot of
the same rows in its own mapping and compares.

xxh3-64 is the default: at these sizes it runs at memory bandwidth
(``benchmarks/checksum_throughput.py`` records GB/s per core for xxh3 and crc32).
A promotion of an 8B-shaped model moves 2 MiB rows, a hundred at a time: one core
digests them in about a sixth of the promotion's own time, so the rows of one
promotion or load are split over a few threads (:class:`Digester`). Both
algorithms release the GIL while they hash a large buffer.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor

import xxhash


def _xxh3_64(buf: memoryview | bytes) -> int:
    # The streaming form: xxhash releases the GIL in it over large inputs in every
    # version kvscope accepts (the one-shot xxh3_64_intdigest held it before 4.0).
    # Same value as xxh3_64_intdigest.
    return xxhash.xxh3_64(buf).intdigest()


ALGORITHMS: dict[str, Callable[[memoryview | bytes], int]] = {
    "xxh3": _xxh3_64,
    "crc32": zlib.crc32,  # releases the GIL over inputs larger than 5 KiB
}
DEFAULT_ALGORITHM = "xxh3"

# Below this many bytes in one call the digests run on the calling thread: handing
# work to other threads costs tens of microseconds, hashing 4 MiB about 0.4 ms.
PARALLEL_MIN_BYTES = 4 << 20
# ... and below this many bytes per buffer on average: each buffer's hash gives the GIL
# back and takes it again, and at 32-64 KiB rows the threads spend their time handing
# it over. On the H200's host 8,000 rows of 32 KiB took as long on 8 threads as on one
# (0.054 / 0.048 s), rows of 128 KiB 2.9x less on 4 (docs/measured-facts.md).
PARALLEL_MIN_ROW_BYTES = 128 << 10
MAX_AUTO_THREADS = 8


class ChecksumPolicy:
    OFF = "off"  # no digests computed anywhere
    OBSERVE = "observe"  # compare and count; a mismatching load is still served
    REFUSE = "refuse"  # compare; a mismatching load is refused and recomputed

    ALL = (OFF, OBSERVE, REFUSE)


def auto_threads() -> int:
    """Half the CPUs this process may run on, at most 8: digests come in bursts
    (one promotion or load), beside vLLM's own threads."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_AUTO_THREADS, cpus // 2))


class Digester:
    """Digests of many buffers, in order; large batches split over ``threads`` threads
    (the calling thread takes one share, so it waits only for the slowest share)."""

    def __init__(self, algorithm: str = DEFAULT_ALGORITHM, threads: int | None = None,
                 parallel_min_bytes: int | None = None,
                 parallel_min_row_bytes: int | None = None) -> None:
        self.fn = ALGORITHMS[algorithm]
        self.threads = auto_threads() if threads is None else max(1, int(threads))
        self.parallel_min_bytes = (PARALLEL_MIN_BYTES if parallel_min_bytes is None
                                   else parallel_min_bytes)
        self.parallel_min_row_bytes = (PARALLEL_MIN_ROW_BYTES if parallel_min_row_bytes is None
                                       else parallel_min_row_bytes)
        self._pool: Executor | None = None
        self._pool_pid = 0  # a pool does not survive fork: make a new one in the child
        self._lock = threading.Lock()

    def many(self, bufs: Sequence[memoryview]) -> list[int]:
        fn = self.fn
        shares = self._shares(bufs)
        if len(shares) < 2:
            return [fn(b) for b in bufs]
        pool = self._executor()
        futures = [pool.submit(_digest_all, fn, share) for share in shares[1:]]
        out = _digest_all(fn, shares[0])
        for f in futures:
            out.extend(f.result())
        return out

    def _shares(self, bufs: Sequence[memoryview]) -> list[Sequence[memoryview]]:
        """Contiguous runs of ``bufs`` of about equal bytes, one per thread."""
        n = min(self.threads, len(bufs))
        if n < 2:
            return [bufs]
        total = sum(len(b) for b in bufs)
        if total < self.parallel_min_bytes or total < self.parallel_min_row_bytes * len(bufs):
            return [bufs]
        shares, start, acc, cut = [], 0, 0, total / n
        for i, b in enumerate(bufs):
            acc += len(b)
            if acc >= cut * (len(shares) + 1) and len(shares) < n - 1:
                shares.append(bufs[start:i + 1])
                start = i + 1
        shares.append(bufs[start:])
        return [s for s in shares if len(s)]

    def _executor(self) -> Executor:
        with self._lock:
            if self._pool is None or self._pool_pid != os.getpid():
                self._pool = ThreadPoolExecutor(self.threads - 1,
                                                thread_name_prefix="kvscope-digest")
                self._pool_pid = os.getpid()
            return self._pool

    def close(self) -> None:
        with self._lock:
            if self._pool is not None and self._pool_pid == os.getpid():
                self._pool.shutdown(wait=False)
            self._pool = None


def _digest_all(fn: Callable[[memoryview], int], bufs: Sequence[memoryview]) -> list[int]:
    return [fn(b) for b in bufs]


def digest_slots(row: memoryview, slot_size: int, world_size: int,
                 algorithm: str = DEFAULT_ALGORITHM) -> tuple[int, ...]:
    """One digest per rank slot of a row laid out ``[rank0 | rank1 | ... | pad]``."""
    fn = ALGORITHMS[algorithm]
    return tuple(fn(row[r * slot_size:(r + 1) * slot_size]) for r in range(world_size))
