"""kvscope's aggregation CPU per iteration of the H200 benchmark's workload, on CPU.

On the H200 (gpu_within_process.py) kvscope's threads add ~5-6.5 ms of CPU an iteration,
which the GIL serializes with vLLM's engine thread under async scheduling. This runs the
same workload shape on vLLM's real scheduler on CPU (kvscope.sim.cpu_engine): an iteration
asks 96 new 1,024-token prompts (96 tokens out), then the previous iteration's 96 again,
restored from the CPU tier (one full-attention group, 8,192 GPU blocks, as there), and
measures the CPU kvscope spends aggregating what the scheduler thread journaled, on
whichever thread it ran: the aggregator thread's clock, plus every synchronous refresh
(an idle step's, the harness's after each ``generate``). No GPU forward runs here, so the
aggregator thread may not get a whole wake-up per iteration: the total is what is compared.

    python benchmarks/aggregator_cost.py [--iterations 6] [--warmup 1] [--profile F]

One JSON line: per timed iteration, aggregation CPU (ms), journal events and items applied,
the scheduler thread's CPU in the reconciliation of lost request ends (``_forget_gone``,
on the steps that schedule nothing while requests live) and its calls, the prefix scans
and those deferred (a key pending), and engine truth (tokens the re-ask restored, from vLLM's ``num_cached_tokens``
per request). ``--profile F`` cProfiles every refresh (thread and synchronous, warm-up included) into F
and writes its top entries as text to F.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import gpu_scheduler_bound as gsb  # this directory: the H200 benchmark's workload
from call_clock import CallClock
from scheduler_overhead import _write_stats

BATCH, PROMPT, OUT = gsb.BATCH, gsb.PROMPT, gsb.OUT
# kvscope's modules in the profile's cumulative listing
OURS = "scheduler_side|aggregator|round_verdicts|coverage|request_states|step_gauges|recorder|" \
       "lookup_rounds|vllm_stats|tier_taps"


def _batch(k: int) -> list[list[int]]:
    """The H200 benchmark's k-th batch of prompts (the same token ids)."""
    return [p["prompt_token_ids"] for p in gsb.batch(k)]


class AggregationClock:
    """CPU seconds kvscope spent in refresh(), on any thread: each call timed on its
    own thread's clock (optionally under cProfile), plus the journal it applied."""

    def __init__(self, observer, profile: bool) -> None:
        import cProfile

        self.cpu_s = 0.0
        self.events = self.items = 0
        self.prof = cProfile.Profile(time.thread_time) if profile else None
        agg, inner = observer.agg, observer.refresh
        from kvscope.connector import compat
        from kvscope.connector.aggregator import journal_events

        def timed(*a, **kw):
            journal = agg.journal
            n = len(journal)
            self.items += n
            self.events += journal_events(journal[:n]) if n else 0
            t0 = time.thread_time()
            if self.prof is not None:
                self.prof.enable()
            try:
                return inner(*a, **kw)
            finally:
                if self.prof is not None:
                    self.prof.disable()
                self.cpu_s += time.thread_time() - t0

        # the thread calls agg._refresh; the synchronous paths call observer.refresh
        agg._refresh = timed
        observer.refresh = timed
        # the scheduler thread's reconciliation of lost request ends (scheduler_side.py),
        # run on steps that schedule nothing while kvscope counts requests live
        self.forget = CallClock().wrap(observer, "_forget_gone")
        # prefix scans, and those deferred (a key pending: the tap then reads the tier's
        # cache policy key by key, prefix_scan.py) - which path of the scan tap this
        # workload takes
        self.scans = self.deferred_scans = 0
        cs = observer.cs
        scan = getattr(cs, compat.SCAN_METHOD, None)
        if observer.lookups_from_scan and scan is not None:
            def counted_scan(*a, **kw):
                n = scan(*a, **kw)
                self.scans += 1
                self.deferred_scans += n is None
                return n

            setattr(cs, compat.SCAN_METHOD, counted_scan)


def run(iterations: int, warmup: int, profile: str | None, per_key: bool) -> dict:
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

    options: dict = {"per_key_lookups": True} if per_key else {}
    cfg = EngineConfig(rows=3 * BATCH * (PROMPT // 16) + 64, tiering=False, kv_groups=1,
                       num_gpu_blocks=8192, max_num_batched_tokens=8192, max_num_seqs=128,
                       max_model_len=2048, kvscope_options=options)
    with CPUEngine(cfg) as e:
        observer = e.connector._kvscope_observer
        clock = AggregationClock(observer, profile is not None)
        rows = []
        prev = _batch(0)
        e.run_until_done([e.add_request(p, OUT) for p in prev], max_steps=10_000)
        for it in range(warmup + iterations):
            new = _batch(it + 1)
            c0, ev0, it0, s0 = clock.cpu_s, clock.events, clock.items, e.steps
            f0, fc0 = clock.forget.seconds, clock.forget.calls
            sc0, ds0 = clock.scans, clock.deferred_scans
            t0 = time.perf_counter()
            e.run_until_done([e.add_request(p, OUT) for p in new], max_steps=10_000)
            again = [e.add_request(p, OUT) for p in prev]
            e.run_until_done(again, max_steps=10_000)
            wall = time.perf_counter() - t0
            restored = sum(e.finished[r].num_cached_tokens for r in again)
            if it >= warmup:
                rows.append({"aggregation_ms": round(1e3 * (clock.cpu_s - c0), 2),
                             "events": clock.events - ev0, "items": clock.items - it0,
                             "steps": e.steps - s0, "wall_s": round(wall, 2),
                             "forget_gone_us": round(1e6 * (clock.forget.seconds - f0), 1),
                             "forget_gone_calls": clock.forget.calls - fc0,
                             "scans": clock.scans - sc0,
                             "deferred_scans": clock.deferred_scans - ds0,
                             "reask_cached_tokens": restored})
            prev = new
        out = {"iterations": rows, "lookups_from_scan": observer.lookups_from_scan,
               "aggregation_ms_median": statistics.median(r["aggregation_ms"] for r in rows),
               "per_key_lookups": per_key}
        if profile:
            _write_stats(clock.prof, profile, OURS)
            out["profile"] = profile + ".txt"
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--profile", help="cProfile every refresh into this file (+ .txt)")
    p.add_argument("--per-key-lookups", action="store_true")
    a = p.parse_args()
    print(json.dumps(run(a.iterations, a.warmup, a.profile, a.per_key_lookups)))


if __name__ == "__main__":
    main()
