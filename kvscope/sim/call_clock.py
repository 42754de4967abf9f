"""Thread CPU time spent inside some of an object's calls, wrapped on the instance: the
benchmarks' one way to split an engine thread's time (the CPU engine's forward, vLLM's
stat logger, the GPU engine's scheduler calls)."""

from __future__ import annotations

import time

_ABSENT = object()


class CallClock:
    def __init__(self, clock=time.thread_time) -> None:
        """``clock``: the calling thread's CPU time (default), or ``time.perf_counter`` for
        wall time (calls that fan out to other threads: digests over a pool)."""
        self.clock = clock
        self.seconds = 0.0
        self.calls = 0
        self.longest = 0.0  # the longest single call (reset by whoever reads it)
        self._sites: list[tuple[object, str]] = []
        self._saved: list[object] = []  # per site: its own attribute before the wrap

    def wrap(self, owner, name: str) -> CallClock:
        self._sites.append((owner, name))
        self._saved.append(self._install(owner, name))
        return self

    def _install(self, owner, name: str) -> object:
        inner = getattr(owner, name)
        # the instance's own attribute, or _ABSENT where it resolves to its class's method:
        # read through getattr, never vars(owner), which (CPython >= 3.11) builds the
        # object's __dict__ and slows every later attribute read of it (vLLM's scan reads
        # the connector scheduler's ``manager`` once per key)
        is_class_method = (getattr(inner, "__self__", None) is owner and
                           getattr(inner, "__func__", None) is getattr(type(owner), name, None))
        own = _ABSENT if is_class_method else inner

        timed = self._timed(inner, name)
        timed.inner = inner  # what it times (a test checks it is the current method)
        setattr(owner, name, timed)
        return own

    def _timed(self, inner, name: str):
        """The wrapper installed over ``inner`` (a subclass may also read the arguments)."""
        clock = self.clock

        def timed(*a, **kw):
            t0 = clock()
            try:
                return inner(*a, **kw)
            finally:
                spent = clock() - t0
                self.seconds += spent
                self.calls += 1
                if spent > self.longest:
                    self.longest = spent

        return timed

    def unwrap(self) -> None:
        """Each wrapped attribute as it was (an instance's own, or none: the class's)."""
        for (owner, name), own in zip(self._sites, self._saved, strict=True):
            if own is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, own)
        self._saved = []

    def rewrap(self) -> None:
        """Wrap again what each site resolves to now (after an object's methods were
        changed under the clock: kvscope switched, a class swapped)."""
        self._saved = [self._install(owner, name) for owner, name in self._sites]


# The connector calls vLLM makes per step or per request, by role
SCHEDULER_CALLS = ("get_num_new_matched_tokens", "update_state_after_alloc",
                   "build_connector_meta", "request_finished", "update_connector_output",
                   "get_kv_connector_stats", "take_events")
WORKER_CALLS = ("bind_connector_metadata", "clear_connector_metadata", "start_load_kv",
                "wait_for_layer_load", "save_kv_layer", "wait_for_save", "get_finished",
                "get_kv_connector_stats", "handle_preemptions", "build_connector_worker_meta")


def clocks_per_call(owner, names, prefix: str) -> dict[str, CallClock]:
    """One clock per method of ``owner`` (each named ``prefix`` + the method's name)."""
    return {prefix + n: CallClock().wrap(owner, n) for n in names
            if callable(getattr(owner, n, None))}
