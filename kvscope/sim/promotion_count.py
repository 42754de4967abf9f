"""What vLLM's tiering manager promoted from its secondary tiers, read at vLLM's own calls:
the load jobs it submitted (``submit_load``: one per request and step, batched) with their
keys, and the keys whose promotion the primary tier was told had failed (``complete_write``
with ``success`` false). The same in both arms of a within-process A/B: it wraps whatever the
method is at the time (kvscope's tap when on, vLLM's own when off) and is put back on top
after each switch (``rewrap``).

Why: a restore that needs more promotions than it has keys churned (rows it promoted were
evicted before their load and promoted again), and a failed read is promoted again too. A
restore that waits thousands of steps reads the same on the clock either way; these counts
tell which (gpu_scale.py's slow restores on the H200: docs/measured-facts.md)."""

from __future__ import annotations

import time

from kvscope.sim.call_clock import CallClock


class PromotionCount(CallClock):
    def __init__(self, manager) -> None:
        super().__init__()
        self.jobs = 0  # promotion jobs submitted
        self.keys = 0  # keys in them
        self.failed_keys = 0  # keys whose promotion completed unsuccessfully
        # the longest job, submitted to completed (wall; reset by whoever reads it): the
        # fs tier's reads, and how long vLLM took to see them done
        self.longest_job_s = 0.0
        self._started: dict[int, float] = {}  # id of a job's key list (vLLM passes the same
        # list to complete_write) -> when it was submitted
        # each completed job's (submitted, completed) on the perf_counter clock: when the
        # fs tier's reads were in flight (whoever reads it clears it)
        self.windows: list[tuple[float, float]] = []
        for tier in manager.secondary_tiers:
            self.wrap(tier, "submit_load")
        self.wrap(manager.primary_tier, "complete_write")

    def snapshot(self) -> tuple[int, int, int]:
        return self.jobs, self.keys, self.failed_keys

    def _timed(self, inner, name: str):
        if name == "submit_load":
            def submit_load(job, *a, **kw):
                self.jobs += 1
                self.keys += len(job.keys)
                self._started[id(job.keys)] = time.perf_counter()
                return inner(job, *a, **kw)
            return submit_load

        def complete_write(keys, *a, **kw):  # (keys, req_context, success=True)
            if not (a[1] if len(a) > 1 else kw.get("success", True)):
                self.failed_keys += len(keys)
            t0 = self._started.pop(id(keys), None)
            if t0 is not None:
                now = time.perf_counter()
                self.longest_job_s = max(self.longest_job_s, now - t0)
                self.windows.append((t0, now))
            return inner(keys, *a, **kw)
        return complete_write
