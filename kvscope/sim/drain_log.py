"""When kvscope's aggregator drained, against when a restore's reads were in flight.

The aggregator holds its periodic drain back while vLLM's tier reads are in flight
(aggregator.HoldBack: at most ``MAX_DEFER_S`` at a time, sampled at each wake-up), because
its GIL is then taken from the fs tier's read threads. A drain that starts inside a read
window anyway (the hold ran out, or a wake-up found no read in flight) is what the hold is
for; :meth:`DrainLog.split` counts those apart from the others (gpu_scale.py, per re-ask).
"""

from __future__ import annotations

import time
from typing import Any


class DrainLog:
    def __init__(self) -> None:
        # each drain: (started, ended) on the perf_counter clock, and its thread's CPU
        self.spans: list[tuple[float, float, float]] = []

    def wrap(self, aggregator: Any) -> DrainLog:
        """Log every periodic drain of ``aggregator`` (its ``_refresh``, looked up at each
        wake-up of its thread)."""
        inner = aggregator._refresh
        spans = self.spans

        def refresh() -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                inner()
            finally:
                spans.append((t0, time.perf_counter(), time.thread_time() - c0))

        aggregator._refresh = refresh
        return self

    def split(self, windows: list[tuple[float, float]]) -> dict:
        """The drains logged so far that started inside one of ``windows`` ((start, end):
        promotion_count.PromotionCount.windows) and the others: count and CPU seconds."""
        inside: list[tuple[float, float, float]] = []
        outside: list[tuple[float, float, float]] = []
        for span in self.spans:
            (inside if any(a <= span[0] < b for a, b in windows) else outside).append(span)
        return {"in_reads": len(inside), "in_reads_cpu_s": round(sum(s[2] for s in inside), 5),
                "other": len(outside), "other_cpu_s": round(sum(s[2] for s in outside), 5)}
