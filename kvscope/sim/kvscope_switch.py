"""kvscope switched off and on inside one running engine: the within-process A/B.

Fresh processes of one configuration spread by +-7 % in tokens/s on the H200 (and were
bimodal in earlier runs), so comparing a stock process with an observed one cannot resolve
1 % without ~50 processes per arm. Here one process holds one engine with
``ObservedOffloadingConnector`` and alternates iterations with kvscope **on** (as loaded) and
**off**; both arms share the process's memory placement, threads and compile state, so the
between-process spread drops out of each pair.

Off means vLLM's stock code path: every connector instance (the scheduler's and each
worker's) is of class ``OffloadingConnector`` again (``__class__`` assigned: vLLM calls
its own methods, no frame of kvscope's), without an observer and without the scheduler
role's hooks (instance attributes: connector/scheduler/hooks.py); the connector scheduler
talks to vLLM's own manager instead of kvscope's proxy and scans with its own method (the
prefix scan's tap removed: connector/lookup/prefix_scan.py), every worker-role connector to
vLLM's own worker instead of kvscope's proxy, and the tiers' methods are their classes'
again (the tier taps removed). What stays while off: kvscope's threads, idle (the
aggregator wakes every flush_interval_s to an empty journal and samples the host's memory
every 5 s; the tier probe waits, as while vLLM's tier I/O is in flight, until kvscope is on
again; in the GPU and CPU restore runs recorded before 2026-12-05 it went on checking the fs tier's files while off, 1,024 ``os.stat`` every 5 s, during the off arm's
restores), and the pass-through of kvscope's Prometheus wrapper in vLLM's stat logger
(built once at start-up; a batch without kvscope keys goes to vLLM's own observe
untouched). Against an engine built with the stock connector, the off arm's residual on CPU
is in benchmarks/results/kvscope_switch_residual_cpu.jsonl.

The switch finds kvscope's hooks and taps through ``getattr`` (:func:`own_function`). Until
2026-12-06 it read ``vars()`` of the connector scheduler and the tiers, which builds their
dicts and slowed vLLM's own deferred step ~5.5 % in both arms on CPU
(results/dict_built_cost.jsonl): every run before then measured stock slower than it runs.

A switch is allowed only when the engine is quiet (no request in vLLM's scheduler, no
transfer job in its offloading connector): a job started in one state and finished in the other would leave
kvscope's books open. A benchmark instrument of the harness: it reaches into kvscope's
private attributes on purpose; the served connector never imports it.
"""

from __future__ import annotations

import math
import os
import types
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

# What kvscope's tier taps set on a tier instance (connector/tiers/taps.py)
TAPPED = ("submit_load", "submit_store", "get_finished_jobs", "prepare_write", "prepare_store",
          "complete_store", "complete_write", "reset_cache")


def own_function(obj: Any, name: str) -> Any:
    """A plain function set on ``obj`` as ``name`` (kvscope's hooks and taps, a benchmark's
    wrapper: each shadows the class's method), or None (``name`` is a method of the class, or
    vLLM's own instance attribute, a bound method). Read through ``getattr``, never
    ``vars(obj)``: from CPython 3.11 that builds the object's dict, and every attribute read
    of it is slower for the rest of its life, in both arms of the A/B
    (tests/connector/test_vllm_objects_untouched.py)."""
    value = getattr(obj, name, None)
    return value if isinstance(value, types.FunctionType) else None


def own_functions(obj: Any, names: Any) -> dict[str, Any]:
    """name -> :func:`own_function` of those of ``names`` that ``obj`` has."""
    return {n: f for n in names if (f := own_function(obj, n)) is not None}


class NotQuiet(RuntimeError):
    """A switch was asked while requests or transfer jobs were in flight."""


def quiet(scheduler: Any) -> bool:
    """No request in vLLM's scheduler and no transfer job in its offloading connector.

    A finished request's offload state may outlive it until the next ``schedule()`` (which
    builds the store job of its last block): that job is then prepared, submitted and
    finished wholly in the new state, so it does not block a switch."""
    return not scheduler.requests and not scheduler.connector.connector_scheduler._jobs


class KvscopeSwitch:
    """Turns one engine's kvscope off and on; ``on`` is the state it was loaded in."""

    def __init__(self, scheduler: Any, worker_connectors: list[Any]) -> None:
        self.scheduler = scheduler
        self.connector = scheduler.connector
        self.observer = self.connector._kvscope_observer
        if self.observer is None:
            raise TypeError("not an ObservedOffloadingConnector's scheduler side")
        self.cs = self.connector.connector_scheduler
        self.manager_proxy = self.cs.manager
        self.manager = self.manager_proxy._inner
        from kvscope.connector.scheduler.hooks import HOOKED

        self.hooks = own_functions(self.connector, HOOKED)
        # the prefix scan's tap on the connector scheduler (connector/lookup/prefix_scan.py), if set
        from kvscope.connector.compat import SCAN_METHOD

        self.cs_taps = own_functions(self.cs, (SCAN_METHOD,))
        # (tier, the taps kvscope had set on it) as read when switched off (_set): the
        # primary tier's per-job taps come once a deferred scan is kept (tiers/taps.py),
        # maybe after this switch was built
        self.tier_taps: list[tuple[Any, dict[str, Any]]] = []
        # (instance, kvscope's class, vLLM's class it subclasses) per connector instance
        self.classes = [(c, type(c), _stock_class(type(c)))
                        for c in (self.connector, *worker_connectors)]
        self.workers = []
        for wc in worker_connectors:
            cw = wc.connector_worker
            self.workers.append((cw, cw.worker, cw.worker._inner))  # (holder, proxy, vLLM's)
        # the tier probe's hold-back as loaded (its busy test and longest wait): paused while
        # off, or its checks of the fs tier's files would run during the off arm's restores,
        # which its busy test (the tier taps' promotions) no longer sees
        probe = self.observer.probe.hold_back
        self.probe_hold = (probe, probe.busy, probe.max_s)
        self.on = True
        # Clocks (call_clock.CallClock) wrapped on the connectors' methods: taken off before
        # a switch and wrapped again after it, so they time what each state calls (a wrapper
        # binds the method it found: left in place it would call kvscope's while off)
        self.clocks: list[Any] = []

    def hold_back(self, mode: str) -> None:
        """The aggregator's hold-back: ``reads`` (kvscope's default: while a restore's
        promotion reads) or ``none`` (it drains every interval)."""
        if mode not in ("reads", "none"):
            raise ValueError(f"hold mode {mode!r}: reads or none")
        self.observer.agg.hold_back.busy = self.observer.taps.reading if mode == "reads" else None

    def set(self, on: bool) -> None:
        if on == self.on:
            return
        if not quiet(self.scheduler):
            raise NotQuiet("switch kvscope only with no request and no transfer in flight")
        for clock in reversed(self.clocks):
            clock.unwrap()
        try:
            self._set(on)
        finally:
            for clock in self.clocks:
                clock.rewrap()

    def _set(self, on: bool) -> None:
        if not on:
            self.observer.refresh()  # everything seen so far reaches the recorder first
            self.tier_taps = [(tier, own_functions(tier, TAPPED))
                              for tier in (self.observer.primary, *self.observer.tiers)
                              if tier is not None]
        self.connector._kvscope_observer = self.observer if on else None
        for name, hook in self.hooks.items():
            if on:
                setattr(self.connector, name, hook)
            else:
                delattr(self.connector, name)  # the class's method again
        self.cs.manager = self.manager_proxy if on else self.manager
        for name, tap in self.cs_taps.items():
            if on:
                setattr(self.cs, name, tap)
            else:
                delattr(self.cs, name)  # the class's method again
        for tier, taps in self.tier_taps:
            for name, tap in taps.items():
                if on:
                    setattr(tier, name, tap)
                elif hasattr(tap, "__wrapped__"):  # vLLM's own instance attribute again
                    setattr(tier, name, tap.__wrapped__)
                else:
                    delattr(tier, name)  # the class's method again
        if on:  # the primary tier changed rows unseen while off: no kept scan is current
            self.observer.taps.changes.reset()
        for cw, proxy, inner in self.workers:
            cw.worker = proxy if on else inner
        for conn, ours, stock in self.classes:
            conn.__class__ = ours if on else stock
        probe, busy, max_s = self.probe_hold
        probe.busy, probe.max_s = (busy, max_s) if on else (_paused, math.inf)
        probe._since = None  # a wait begun in the other state is not this one's
        self.on = on


def _paused() -> bool:
    """The tier probe's busy test while kvscope is off: always busy, so it waits."""
    return True


def _stock_class(cls: type) -> type:
    """The first class of ``cls``'s MRO that is not kvscope's: vLLM's connector."""
    return next(c for c in cls.__mro__ if not c.__module__.startswith("kvscope"))
