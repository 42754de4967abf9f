"""Thread CPU time spent inside some of an object's calls, wrapped on the instance: the
benchmarks' one way to split an engine thread's time (the CPU engine's forward, vLLM's
stat logger, the GPU engine's scheduler calls)."""

from __future__ import annotations

import time


class CallClock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, owner, name: str) -> CallClock:
        inner = getattr(owner, name)

        def timed(*a, **kw):
            t0 = time.thread_time()
            try:
                return inner(*a, **kw)
            finally:
                self.seconds += time.thread_time() - t0

        setattr(owner, name, timed)
        return self
