"""Digests of rank slots of primary-tier rows.

A promotion (disk -> CPU) writes whole rows into the scheduler host's shared
region. On a multi-node TP deployment the other nodes' regions never see those
bytes. The scheduler side digests each rank's slot of a promoted row when the
promotion completes; before a CPU -> GPU load, each rank digests its own slot of
the same rows in its own mapping and compares.

xxh3-64 is the default: at these sizes it runs at memory bandwidth
(``benchmarks/checksum_throughput.py`` records GB/s per core for xxh3 and crc32).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import xxhash

ALGORITHMS: dict[str, Callable[[memoryview | bytes], int]] = {
    "xxh3": xxhash.xxh3_64_intdigest,
    "crc32": zlib.crc32,
}
DEFAULT_ALGORITHM = "xxh3"


class ChecksumPolicy:
    OFF = "off"  # no digests computed anywhere
    OBSERVE = "observe"  # compare and count; a mismatching load is still served
    REFUSE = "refuse"  # compare; a mismatching load is refused and recomputed

    ALL = (OFF, OBSERVE, REFUSE)


def digest_slots(row: memoryview, slot_size: int, world_size: int,
                 algorithm: str = DEFAULT_ALGORITHM) -> tuple[int, ...]:
    """One digest per rank slot of a row laid out ``[rank0 | rank1 | ... | pad]``."""
    fn = ALGORITHMS[algorithm]
    return tuple(fn(row[r * slot_size:(r + 1) * slot_size]) for r in range(world_size))
