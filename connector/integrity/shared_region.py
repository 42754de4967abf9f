"""Which ranks read the very bytes a promotion wrote: ranks that map the scheduler's file.

A promotion writes whole rows into the scheduler host's primary-tier file
(``/dev/shm/vllm_offload_<engine>.mmap``, mapped ``MAP_SHARED`` by every process that opens
it). A rank that maps that same file (same host, same ``/dev/shm``) reads those pages
themselves: its slot cannot be stale, and digesting it on both sides compares a page with
itself at the cost of a pass over every promoted byte on each side (~5 % of a
131k-token restore on the H200, docs/measured-facts.md). Only a rank that maps another
file (another node's ``/dev/shm``, a container with a ``/dev/shm`` of its own) can load
stale rows.

How the scheduler learns it without a channel through vLLM: each rank writes a marker
next to the file it mapped, ``<file>.kvscope-rank<r>``, holding that file's identity
(boot id, device, inode). A rank on the scheduler's host and ``/dev/shm`` writes it where
the scheduler looks; a rank elsewhere writes it into its own host's ``/dev/shm``, which the
scheduler never reads. The scheduler leaves a rank's slot undigested only once it has read
that rank's marker next to its own file with its own file's identity; until then (no marker
yet, another identity, unreadable) it digests the rank's slot as before.

``checksum_scope`` ``all`` digests every rank anyway: it also catches bytes changed in place
between a promotion and its load (a stray write into the row; the test fault
``flip_promoted``), at that cost.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from kvscope.connector import compat

logger = logging.getLogger("kvscope")

MARKER_SUFFIX = ".kvscope-rank"
RECHECK_S = 1.0  # how often the scheduler looks again for the markers it has not matched
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


class ChecksumScope:
    UNSHARED = "unshared"  # default: ranks that do not map the scheduler's own region file
    ALL = "all"  # every rank, sharing or not

    ALL_SCOPES = (UNSHARED, ALL)


def region_identity(region: Any) -> str | None:
    """``boot id:device:inode`` of the file behind ``region`` (a SharedOffloadRegion:
    ``compat.region_file``); None when it cannot be told (no path, no such file, no boot
    id): then nothing is taken as shared."""
    fd, path = compat.region_file(region)
    if path is None:
        return None
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
        st = os.fstat(fd) if fd is not None else os.stat(path)
    except OSError:
        return None
    return f"{boot}:{st.st_dev}:{st.st_ino}" if boot else None


def marker_path(region_path: str, rank: int) -> str:
    return f"{region_path}{MARKER_SUFFIX}{rank}"


def write_marker(region: Any, rank: int) -> str | None:
    """This rank's marker next to the file it mapped (written whole: a temporary renamed);
    the marker's path, or None when the region's file cannot be told."""
    identity, path = region_identity(region), compat.region_file(region)[1]
    if identity is None:
        return None
    marker = marker_path(path, rank)
    tmp = f"{marker}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(identity)
    os.replace(tmp, marker)
    return marker


def remove_marker(marker: str | None) -> None:
    if marker:
        try:
            os.unlink(marker)
        except OSError:
            pass


class SharedRanks:
    """Scheduler side: the ranks whose slots a promotion's digests must cover."""

    def __init__(self, region: Any, world_size: int, scope: str = ChecksumScope.UNSHARED,
                 recheck_s: float = RECHECK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.world_size = world_size
        # None (scope all, or the file cannot be told): every rank digested, no marker read
        self.identity = region_identity(region) if scope == ChecksumScope.UNSHARED else None
        self.path = compat.region_file(region)[1]
        self.shared: frozenset[int] = frozenset()  # a rank maps one file for its life
        self.digested: tuple[int, ...] = tuple(range(world_size))
        self._recheck_s = recheck_s
        self._clock = clock
        self._next_check = float("-inf")

    def to_digest(self) -> tuple[int, ...]:
        """The ranks not known to share the scheduler's file (per promotion: once every
        rank is known, a tuple read; until then the markers at most every recheck_s)."""
        if self.digested and self.identity is not None:
            now = self._clock()
            if now >= self._next_check:
                self._next_check = now + self._recheck_s
                self._read_markers()
        return self.digested

    def _read_markers(self) -> None:
        shared = set(self.shared)
        for rank in self.digested:
            try:
                with open(marker_path(self.path, rank)) as f:
                    if f.read().strip() == self.identity:
                        shared.add(rank)
            except OSError:
                continue
        if len(shared) != len(self.shared):
            self.shared = frozenset(shared)
            self.digested = tuple(r for r in range(self.world_size) if r not in shared)
            logger.info("kvscope: ranks %s map the scheduler's own region file; promoted rows "
                        "are digested for ranks %s", sorted(shared), list(self.digested))
