"""The host's available memory and this process's resident memory, from ``/proc``.

Memory that keeps falling while the engine has nothing to do is a leak: in the engine
process (its resident memory grows with it) or elsewhere on the host. Two gauges tell
which (``kvscope_host_memory_available_bytes``, ``kvscope_process_resident_memory_bytes``).

Read at most every :data:`SAMPLE_S` seconds, never per event and never on vLLM's
scheduler thread while it is busy: with the other gauges (the aggregator thread while
events arrive, the scheduler thread only on an idle step) and on the aggregator thread's
quiet wake-ups while nothing happens (``connector/aggregator.py``). One sample is two
small reads of ``/proc`` (MemAvailable, then ``/proc/self/statm``), about 20 µs. Where
``/proc`` lacks them (not Linux) the gauges are never set: absent, never a zero.
"""

from __future__ import annotations

import os
import time

from kvscope.exporters import signals
from kvscope.exporters.recorder import Key

# Seconds between two samples: memory trends are read over minutes (kv-diagnose, the
# alert), and a read costs file-system calls on whichever kvscope thread takes it.
SAMPLE_S = 5.0
MEMINFO = "/proc/meminfo"
STATM = "/proc/self/statm"
_AVAILABLE = (signals.HOST_MEMORY_AVAILABLE, ())
_RESIDENT = (signals.PROCESS_RESIDENT_MEMORY, ())


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 8192)
    finally:
        os.close(fd)


def mem_available(meminfo: bytes) -> int | None:
    """Bytes of ``MemAvailable`` in a ``/proc/meminfo`` text (kB there), or None."""
    at = meminfo.find(b"MemAvailable:")
    if at < 0:
        return None
    fields = meminfo[at:meminfo.find(b"\n", at)].split()
    return int(fields[1]) * 1024 if len(fields) >= 2 else None


def resident_bytes(statm: bytes) -> int | None:
    """Resident bytes in a ``/proc/<pid>/statm`` text (its second field, in pages)."""
    fields = statm.split()
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE") if len(fields) >= 2 else None


class HostMemory:
    """Samples of the two gauges, at most every ``interval_s`` seconds."""

    def __init__(self, interval_s: float = SAMPLE_S, meminfo: str = MEMINFO,
                 statm: str = STATM) -> None:
        self.interval_s = interval_s
        self.meminfo, self.statm = meminfo, statm
        self._at = -float("inf")  # monotonic time of the last sample
        self.samples = 0  # taken so far (tests)

    def due(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) - self._at >= self.interval_s

    def sample(self, now: float | None = None) -> list[tuple[Key, float]]:
        """The gauges' values now, as (key, value) pairs for ``Recorder.set_many``, if a
        sample is due (else []). A file ``/proc`` lacks leaves its gauge out; any other
        error is the caller's to count."""
        now = time.monotonic() if now is None else now
        if now - self._at < self.interval_s:
            return []
        self._at = now
        self.samples += 1
        out: list[tuple[Key, float]] = []
        for key, path, parse in ((_AVAILABLE, self.meminfo, mem_available),
                                 (_RESIDENT, self.statm, resident_bytes)):
            try:
                value = parse(_read(path))
            except FileNotFoundError:
                continue
            if value is not None:
                out.append((key, float(value)))
        return out
