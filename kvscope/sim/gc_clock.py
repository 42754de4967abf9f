"""Garbage collections timed per thread and per engine: where the engine thread's time goes
when a profile cannot see it (a collection charged to whatever ran when it struck).

``GCClock`` is a ``gc.callbacks`` entry timing each collection on the collecting thread's CPU
clock, per generation and per where it ran (inside an engine's timed scheduler calls, marked by
``label_scheduler``, or on a named thread); the lockstep and restore benchmarks use it.
"""

from __future__ import annotations

import gc
import threading
import time


class GCClock:
    """Collections timed per (where, generation): where = the engine whose timed scheduler
    call is running on the collecting thread, or that thread's name."""

    def __init__(self) -> None:
        self.inside: dict[int, str] = {}  # thread id -> engine label while in a timed call
        self.spent: dict[tuple[str, int], list] = {}
        self._t0: dict[int, float] = {}
        self.collected = 0

    def __call__(self, phase: str, info: dict) -> None:
        tid = threading.get_ident()
        if phase == "start":
            self._t0[tid] = time.thread_time()
            return
        dt = time.thread_time() - self._t0.pop(tid, time.thread_time())
        where = self.inside.get(tid) or threading.current_thread().name
        slot = self.spent.setdefault((where, info["generation"]), [0, 0.0])
        slot[0] += 1
        slot[1] += dt
        self.collected += info.get("collected", 0)

    def in_engine(self, label: str) -> float:
        return sum(s for (w, _), (_, s) in self.spent.items() if w == label)

    def totals(self) -> tuple[list[int], float]:
        """(collections per generation, their seconds), summed over every thread."""
        n, spent = [0, 0, 0], 0.0
        for (_, g), (c, t) in self.spent.items():
            n[g] += c
            spent += t
        return n, spent

    def table(self) -> dict:
        return {f"{w}/gen{g}": [n, round(s, 4)] for (w, g), (n, s) in sorted(self.spent.items())}


def label_scheduler(e, label: str, clock: GCClock, allocs: list) -> None:
    """Mark the engine's timed calls so a collection inside them is charged to it; count
    gen0 allocations (net of frees) per call."""
    sched = e.scheduler
    for name in ("schedule", "update_from_output"):
        inner = getattr(sched, name)

        def marked(*a, _inner=inner, **kw):
            tid = threading.get_ident()
            clock.inside[tid] = label
            c0 = gc.get_count()[0]
            try:
                return _inner(*a, **kw)
            finally:
                clock.inside.pop(tid, None)
                allocs[0] += 1
                allocs[1] += max(gc.get_count()[0] - c0, 0)

        setattr(sched, name, marked)
