"""Where a process's CPU went between two points, per kind of thread, from the kernel's own
accounting (``/proc/self/task/<tid>/schedstat``: nanoseconds on a CPU, nanoseconds runnable
but waiting for one). Nothing runs in the process to collect it, so it perturbs nothing
between the two reads.

The kinds: ``engine`` (the main thread: the in-process engine's scheduler, model runner,
worker-side connector calls and output processing), ``kvscope`` (threads kvscope names
``kvscope-*``: the aggregator, the tier probe, digests) and ``other`` (vLLM's, torch's,
prometheus-client's). An engine thread's wall time minus its CPU and run-queue time is the
time it was blocked: waiting for the GPU, or for the GIL while another thread held it.
"""

from __future__ import annotations

import os
import threading

KINDS = ("engine", "kvscope", "other")


def _kind(tid: int, names: dict[int, str], main: int) -> str:
    if tid == main:
        return "engine"
    return "kvscope" if names.get(tid, "").startswith("kvscope") else "other"


def snapshot() -> dict[int, tuple[str, int, int]]:
    """tid -> (kind, on-CPU ns, run-queue ns) of every thread alive now."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    main = threading.main_thread().native_id
    out: dict[int, tuple[str, int, int]] = {}
    for entry in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{entry}/schedstat") as f:
                run, wait, _ = f.read().split()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        tid = int(entry)
        out[tid] = (_kind(tid, names, main), int(run), int(wait))
    return out


def between(before: dict[int, tuple[str, int, int]],
            after: dict[int, tuple[str, int, int]]) -> dict[str, dict[str, float]]:
    """Seconds on CPU and waiting for one, per kind, between two snapshots. A thread that
    started in between counts from zero; one that ended in between is lost (its last
    interval is not in ``after``)."""
    out = {k: {"cpu_s": 0.0, "runq_s": 0.0} for k in KINDS}
    for tid, (kind, run, wait) in after.items():
        _, run0, wait0 = before.get(tid, (kind, 0, 0))
        out[kind]["cpu_s"] += (run - run0) / 1e9
        out[kind]["runq_s"] += (wait - wait0) / 1e9
    return {k: {n: round(v, 4) for n, v in d.items()} for k, d in out.items()}
