"""The long-prompt round's engines stepped together, phase by phase, and what a phase cost each.

Engines (the observed one last) step in lockstep (kvscope.sim.lockstep: step by
step, rotating which goes first; which goes first also alternates from one call to the
next), each ask followed by a drain (stores pending). :meth:`Pair.measure` reads, over a
phase: each engine's thread CPU inside its scheduler calls, the collections that ran inside
them (gc_clock.GCClock), the keys its prefix scans looked up
(scale_workload.KeyCount), kvscope's threads' CPU (thread_cpu.py: the kernel's per-thread
accounting) and the journal's peak after any observed step.
"""

from __future__ import annotations

import gc
import threading
import time

from kvscope.sim import scale_workload as w
from kvscope.sim import thread_cpu
from kvscope.sim.gc_clock import GCClock, label_scheduler
from kvscope.sim.lockstep import final_refresh, lockstep


class Pair:
    """Engines stepped together (the observed one last), with what a phase reads of them."""

    def __init__(self, engines: list) -> None:
        self.engines = engines
        self.obs = engines[-1]
        self.observer = getattr(self.obs.connector, "_kvscope_observer", None)  # stock: None
        self.keys = [w.KeyCount(e) for e in engines]
        self.peak = 0
        self._calls = 0
        # collections timed where they ran: inside engine i's timed scheduler calls
        # (label str(i)) or on a thread by its name (close() unhooks it)
        self.gc = GCClock()
        for i, e in enumerate(engines):
            label_scheduler(e, str(i), self.gc, [0, 0])
        gc.callbacks.append(self.gc)

    def close(self) -> None:
        gc.callbacks.remove(self.gc)

    def _gc_s(self) -> tuple[list[float], float]:
        """GC seconds so far: inside each engine's timed calls; on kvscope's threads."""
        on_kvscope = sum(s for (where, _), (_, s) in self.gc.spent.items()
                         if where.startswith("kvscope"))
        return [self.gc.in_engine(str(i)) for i in range(len(self.engines))], on_kvscope

    def _journal_len(self) -> int:
        journal = getattr(getattr(self.observer, "agg", None), "journal", None)
        return len(journal) if journal is not None else -1

    def _after_step(self, i: int) -> None:
        if i == len(self.engines) - 1:
            self.peak = max(self.peak, self._journal_len())

    def ask(self, prompts: list[list[int]]) -> list[list[str]]:
        """Ask ``prompts`` on every engine, step until done, then until nothing is pending."""
        rids = [[e.add_request(p, w.OUT) for p in prompts] for e in self.engines]
        self.step(rids)
        return rids

    def step(self, rids: list[list[str]]) -> None:
        # which engine steps first alternates from one call to the next too (lockstep
        # rotates within a call, starting with its first): the drain is a step or two
        order = list(range(len(self.engines)))[::-1 if self._calls % 2 else 1]
        self._calls += 1
        engines = [self.engines[i] for i in order]

        def after(j: int) -> None:
            self._after_step(order[j])

        lockstep([(engines[j], rids[i]) for j, i in enumerate(order)], after_step=after)
        lockstep([(e, []) for e in engines], after_step=after,
                 busy=lambda j: engines[j].scheduler.has_requests())

    def measure(self, run) -> dict:
        """Run ``run()`` (a phase) and what it cost on each engine."""
        self.obs.refresh()  # what earlier phases left is theirs
        s0 = [e.scheduler_seconds for e in self.engines]
        n0 = [e.steps for e in self.engines]
        k0 = [k.keys for k in self.keys]
        self.peak = self._journal_len()
        gc0, gck0 = self._gc_s()
        was = {k: tuple(v) for k, v in self.gc.spent.items()}
        snap0, t0 = thread_cpu.snapshot(), time.perf_counter()
        run()
        final = final_refresh(self.obs)  # waits for a refresh the thread is in
        wall, snap1 = time.perf_counter() - t0, thread_cpu.snapshot()
        gc1, gck1 = self._gc_s()
        collections = {f"{where}/gen{g}": [n - was.get((where, g), (0, 0.0))[0],
                                           round(t - was.get((where, g), (0, 0.0))[1], 4)]
                       for (where, g), (n, t) in sorted(self.gc.spent.items())
                       if n > was.get((where, g), (0, 0.0))[0]}
        return {"scheduler_s": [e.scheduler_seconds - s for e, s in zip(self.engines, s0)],
                "gc_s": [b - a for a, b in zip(gc0, gc1)], "gc_kvscope_threads_s": gck1 - gck0,
                # per where (engine index, thread name) and generation: [count, seconds]
                "collections": collections,
                "steps": [e.steps - n for e, n in zip(self.engines, n0)],
                "keys": [None if n is None else k.keys - n for k, n in zip(self.keys, k0)],
                "kvscope_threads_s": thread_cpu.between(snap0, snap1)["kvscope"]["cpu_s"],
                "kvscope_threads_by_name": _by_name(snap0, snap1),
                "final_refresh_s": final, "journal_peak": self.peak, "wall_s": wall}


def _by_name(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds of kvscope's threads between two thread_cpu snapshots, per thread name
    (the digest pool's threads summed)."""
    names = {t.native_id: t.name.split("_")[0] for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid, (kind, run, _) in after.items():
        if kind == "kvscope":
            name = names.get(tid, "kvscope-?")
            out[name] = out.get(name, 0.0) + (run - before.get(tid, (kind, 0, 0))[1]) / 1e9
    return {n: round(v, 4) for n, v in sorted(out.items())}
