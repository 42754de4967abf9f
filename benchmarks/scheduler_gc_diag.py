"""Where the engine thread's extra time goes when a profile cannot see it: GC and threads.

    python benchmarks/scheduler_gc_diag.py [--requests 1000] [--rounds 1] [--no-tiering]
        [--gc normal|freeze|disable] [--no-aggregator]

The lockstep pair of ``scheduler_overhead.py`` (same engines, same workload), with:

* every garbage collection timed (``gc.callbacks``, the collecting thread's CPU clock),
  per generation and per where it ran: inside the stock engine's timed scheduler calls,
  inside the observed engine's, on kvscope's aggregator thread, elsewhere;
* ``--gc freeze`` (``gc.freeze()`` after the engines are built: the long-lived heap of
  torch, vLLM and the engines leaves the collector's view) or ``--gc disable``: a
  diagnostic, applied to both engines alike, not a fix;
* ``--no-aggregator``: kvscope's aggregator thread not started; the observed engine's
  journal applied after each of its steps, outside the timed calls (what threads and the
  GIL cost the engine thread, not what aggregating costs);
* the journal's events per step and the gen0 allocations per timed call of each engine.

The last JSON line carries ``step_time_ratio_observed_over_stock`` (median of the rounds)
and ``step_time_ratio_without_gc`` (each engine's timed time minus the collections that
ran inside it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import scheduler_overhead as so  # noqa: E402


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


def _label_scheduler(e, label: str, clock: GCClock, allocs: list) -> None:
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


def _split_connector(e, spent: dict) -> None:
    """Time each connector method the scheduler calls (inclusive, engine thread's CPU
    clock), as instance attributes: what is left of the timed calls is vLLM's own code."""
    conn = e.scheduler.connector
    for name in dir(type(conn)):
        if name.startswith("_") or not callable(getattr(conn, name, None)):
            continue
        inner, slot = getattr(conn, name), spent.setdefault(name, [0, 0.0])

        def timed(*a, _inner=inner, _slot=slot, **kw):
            t0 = time.thread_time()
            try:
                return _inner(*a, **kw)
            finally:
                _slot[0] += 1
                _slot[1] += time.thread_time() - t0

        setattr(conn, name, timed)


def run_pair(n_requests: int, tiering: bool, gc_mode: str, no_aggregator: bool,
             split: bool = False) -> dict:
    from kvscope.connector import aggregator

    start = aggregator.Aggregator.start
    if no_aggregator:
        aggregator.Aggregator.start = lambda self: self
    try:
        stock_cm, obs_cm = so._engine(so.STOCK, tiering), so._engine(so.OBSERVED, tiering)
    finally:
        aggregator.Aggregator.start = start
    clock = GCClock()
    with stock_cm as stock, obs_cm as observed:
        engines = [(stock, so._add_requests(stock, n_requests)),
                   (observed, so._add_requests(observed, n_requests))]
        allocs = {"stock": [0, 0], "observed": [0, 0]}
        _label_scheduler(stock, "stock", clock, allocs["stock"])
        _label_scheduler(observed, "observed", clock, allocs["observed"])
        observer = observed.connector._kvscope_observer
        calls: dict[str, dict] = {"stock": {}, "observed": {}}
        if split:
            _split_connector(stock, calls["stock"])
            _split_connector(observed, calls["observed"])
        journal_events = [0, 0]  # events, steps

        from kvscope.connector.aggregator import journal_events as count_events

        def count_journal():
            journal_events[0] += count_events(observer.journal)
            journal_events[1] += 1

        gc.collect()
        if gc_mode == "freeze":
            gc.freeze()
        elif gc_mode == "disable":
            gc.disable()
        gc.callbacks.append(clock)
        try:
            def after_step(i: int) -> None:
                if i == 1 and no_aggregator:
                    count_journal()
                    observed.refresh()

            so.lockstep(engines, after_step=after_step)
        finally:
            gc.callbacks.remove(clock)
            gc.enable()
            gc.unfreeze()
        threads_s = so._kvscope_threads_cpu(observed)
        s, o = stock.scheduler_seconds, observed.scheduler_seconds
        gs, go = clock.in_engine("stock"), clock.in_engine("observed")
        return {"gc": gc_mode, "no_aggregator": no_aggregator, "tiering": tiering,
                "load1": round(os.getloadavg()[0], 2),
                "stock_s": round(s, 4), "observed_s": round(o, 4),
                "ratio": round(o / s, 4), "gc_in_stock_s": round(gs, 4),
                "gc_in_observed_s": round(go, 4),
                "ratio_without_gc": round((o - go) / (s - gs), 4),
                "gc_table": clock.table(),
                "gen0_allocs_per_call": {k: round(v[1] / max(v[0], 1), 1)
                                         for k, v in allocs.items()},
                "journal_events_per_step": (round(journal_events[0] / journal_events[1], 1)
                                            if journal_events[1] else None),
                "kvscope_threads_s": round(threads_s, 4), "steps": observed.steps,
                **({"split": _split_table(calls, s, o)} if split else {})}


def _split_table(calls: dict, s: float, o: float) -> dict:
    out = {}
    for name in sorted(set(calls["stock"]) | set(calls["observed"])):
        a, b = calls["stock"].get(name, [0, 0.0]), calls["observed"].get(name, [0, 0.0])
        if a[0] or b[0]:
            out[name] = [a[0], round(a[1], 4), b[0], round(b[1], 4)]
    rest_s = s - sum(v[1] for v in calls["stock"].values())
    rest_o = o - sum(v[1] for v in calls["observed"].values())
    out["vllm_rest"] = [round(rest_s, 4), round(rest_o, 4)]
    return out


def main() -> None:
    p = so.workload_args(argparse.ArgumentParser(), rounds=1)
    p.add_argument("--gc", choices=["normal", "freeze", "disable"], default="normal")
    p.add_argument("--no-aggregator", action="store_true")
    p.add_argument("--split", action="store_true",
                   help="time each connector method (both engines): vLLM's own rest")
    args = p.parse_args()
    rows = []
    for _ in range(args.rounds):
        r = run_pair(args.requests, not args.no_tiering, args.gc, args.no_aggregator,
                     args.split)
        rows.append(r)
        print(json.dumps(r), flush=True)
    print(json.dumps({
        "gc": args.gc, "no_aggregator": args.no_aggregator, "tiering": not args.no_tiering,
        "pair_ratios": [r["ratio"] for r in rows],
        "step_time_ratio_without_gc": statistics.median(r["ratio_without_gc"] for r in rows),
        "step_time_ratio_observed_over_stock": statistics.median(r["ratio"] for r in rows)}))


if __name__ == "__main__":
    main()
