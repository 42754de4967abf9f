"""Engines of vLLM's real scheduler on CPU stepped in lockstep: the harness the CPU overhead
benchmarks share (stock ``OffloadingConnector`` beside ``ObservedOffloadingConnector``, the same
workload, step by step), with the clocks and profilers they read."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

STOCK, OBSERVED = "OffloadingConnector", "ObservedOffloadingConnector"


def engine(connector: str, tiering: bool, flush_interval_s: float | None = None,
           per_key_lookups: bool = False, kvscope_threads: bool = True):
    """``kvscope_threads=False``: kvscope's threads never run beside the engine's (the
    aggregator asleep for an hour and never woken by the journal's bound, no tier probe):
    every event is applied on the engine's thread at the step that leaves it idle."""
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

    options = {} if flush_interval_s is None else {"flush_interval_s": flush_interval_s}
    if per_key_lookups:
        options["per_key_lookups"] = True
    if not kvscope_threads:
        options.update(flush_interval_s=3600.0, tier_probe_interval_s=0.0)
    e = CPUEngine(EngineConfig(rows=512, tiering=tiering, world_size=1, kv_groups=1,
                               num_gpu_blocks=512, max_num_batched_tokens=512,
                               max_num_seqs=32, connector=connector, step_time_s=0.0,
                               kvscope_options=options))
    observer = getattr(e.connector, "_kvscope_observer", None)
    if not kvscope_threads and observer is not None:
        observer.agg.wake_at = observer.agg.limit
    return e


def add_requests(e, n_requests: int) -> list[str]:
    from kvscope.sim.cpu_engine import prompt

    shared = prompt(0, 64)  # a shared prefix, so lookups find something
    return [e.add_request(shared + prompt(i, 32), 8) for i in range(n_requests)]


def kvscope_threads_cpu(e) -> float:
    """CPU seconds so far of the observed engine's kvscope threads (per-thread clocks)."""
    observer = getattr(e.connector, "_kvscope_observer", None)
    if observer is None:
        return 0.0
    total = 0.0
    agg = getattr(observer, "agg", None)  # None: a kvscope before the aggregator thread
    for thread in (agg and agg.thread, getattr(observer.probe, "_thread", None)):
        if thread is not None and thread.is_alive():
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return total


def final_refresh(e) -> float:
    t0 = time.thread_time()
    e.refresh()
    return time.thread_time() - t0


def lockstep(todo: list, clock: Callable[[], float] = time.perf_counter,
             after_step: Callable[[int], None] | None = None,
             busy: Callable[[int], bool] | None = None) -> list[float]:
    """Step engines in turn until each one's requests are done, rotating which goes first
    (step k starts with engine k mod n), so all see the same machine at each moment: on a
    shared box, drift between whole runs is larger than the effects measured. ``todo``:
    (engine, request ids) pairs; returns each engine's ``clock`` time inside ``step()``;
    ``after_step(i)`` runs after engine i's step, outside the timing; ``busy(i)``, if
    given, says instead whether engine i needs another step (a drain: stores pending)."""
    if busy is None:
        def busy(i: int) -> bool:
            e, rids = todo[i]
            return any(r not in e.finished for r in rids)
    spent = [0.0] * len(todo)
    n, step = len(todo), 0
    while any(busy(i) for i in range(n)):
        for i in [*range(step % n, n), *range(step % n)]:
            e, rids = todo[i]
            if busy(i):
                t0 = clock()
                e.step()
                spent[i] += clock() - t0
                if after_step is not None:
                    after_step(i)
        step += 1
        if step > 100_000:
            raise TimeoutError("requests not done after 100000 steps")
    return spent


def profile_aggregator_thread(e):
    """cProfile kvscope's aggregator thread: every refresh it runs (on its own thread's
    CPU clock), not the engine thread's synchronous ones."""
    import cProfile

    agg = e.connector._kvscope_observer.agg
    prof = cProfile.Profile(time.thread_time)
    inner = agg._refresh

    def profiled() -> None:
        prof.enable()
        try:
            inner()
        finally:
            prof.disable()

    agg._refresh = profiled
    return prof


def profile_scheduler_calls(scheduler, path: str) -> None:
    """Profile inside Scheduler.schedule / update_from_output only (what the ratio times)."""
    import cProfile

    # The engine thread's CPU time (as the ratio): a wall-clock timer would charge the
    # function that waited for the GIL with what kvscope's aggregator thread did meanwhile.
    prof = scheduler._bench_profile = cProfile.Profile(time.thread_time)
    for name in ("schedule", "update_from_output"):
        inner = getattr(scheduler, name)

        def profiled(*a, _inner=inner, **kw):
            prof.enable()
            try:
                return _inner(*a, **kw)
            finally:
                prof.disable()

        setattr(scheduler, name, profiled)


def write_profile(scheduler, path: str) -> None:
    write_stats(scheduler._bench_profile, path,
                 "observed|observer.py|hooks.py|manager_proxy|prefix_scan|recorder|"
                 "coverage|"
                 "compat|offloading|rounds.py|round_verdicts|taps.py|promoted_rows.py|"
                 "request_states|step_gauges")


def write_stats(prof, path: str, ours: str) -> None:
    import io
    import pstats

    prof.dump_stats(path)
    if not prof.getstats():  # nothing ran profiled (a run shorter than the cadence)
        with open(path + ".txt", "w") as f:
            f.write("no call profiled\n")
        return
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(ours, 40)
    stats.sort_stats("tottime").print_stats(ours, 40)  # kvscope's own time, per function
    with open(path + ".txt", "w") as f:
        f.write(out.getvalue())


def workload_args(p: argparse.ArgumentParser, rounds: int = 3) -> argparse.ArgumentParser:
    """The workload options every lockstep benchmark here shares."""
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--no-tiering", action="store_true")
    return p
