"""Requests as the connector sees them: queued, deferred, loading, running.

Counts are kept incrementally, so the ``kvscope_requests{state}`` gauges never
scan all requests. States are small ints (an Enum's hash is Python code) and the
per-step update touches only requests that can change state without a connector
call telling us: deferred ones not asked again (queued behind capacity), loading
ones vLLM scheduled (their load finished), preempted ones. Updated on the aggregator
thread, from the journal (aggregator.py), in the order the calls happened.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from kvscope.connector.lookup.restore_clock import RestoreClock
from kvscope.exporters.signals import RequestState

QUEUED, DEFERRED, LOADING, RUNNING = range(4)
STATES: tuple[RequestState, ...] = (RequestState.QUEUED, RequestState.DEFERRED,
                                    RequestState.LOADING, RequestState.RUNNING)
_RESTORING = (DEFERRED, LOADING)


class RequestStates:
    def __init__(self, chunk_tokens: list[int]) -> None:
        self.state: dict[str, int] = {}
        self.counts = [0, 0, 0, 0]  # indexed like STATES
        self.deferred: set[str] = set()
        self.loading: set[str] = set()
        self.looked_up: set[str] = set()  # requests with a lookup round this step
        # deferred requests not asked again since (queued behind capacity): still waiting
        # on their restore; counted with the restoring ones when the row ceiling cuts one
        self.parked: set[str] = set()
        # request -> chunk keys its whole prefix covers (once per request)
        self.need: dict[str, int] = {}
        self._chunk_tokens = chunk_tokens  # tokens per chunk of each KV group
        self.clock = RestoreClock()  # where each restore's time went

    def __len__(self) -> int:
        return len(self.state)

    def set(self, rid: str, new: int, known_only: bool = False) -> None:
        state = self.state
        old = state.get(rid)
        if old == new or (known_only and old is None):
            return
        counts = self.counts
        if old is not None:
            counts[old] -= 1
            if old == DEFERRED:
                self.deferred.discard(rid)
            elif old == LOADING:
                self.loading.discard(rid)
        state[rid] = new
        counts[new] += 1
        if new == DEFERRED:
            self.deferred.add(rid)
        elif new == LOADING:
            self.loading.add(rid)

    # ---- connector calls ---------------------------------------------------------------
    def on_new(self, rid: str) -> None:
        if rid in self.state:
            self.set(rid, QUEUED)
        else:  # the common case, inlined: once per request
            self.state[rid] = QUEUED
            self.counts[QUEUED] += 1

    def on_round(self, rid: str, num_tokens: int, deferred: bool) -> None:
        """``num_tokens``: the request's token count when its round ended. Once per round
        (on the aggregator thread): set's no-change case inlined."""
        need = self.need
        if rid not in need:  # a request's first round only
            need[rid] = self.request_keys(num_tokens)
        self.looked_up.add(rid)
        if self.parked:
            self.parked.discard(rid)
        new = DEFERRED if deferred else QUEUED
        old = self.state.get(rid)
        if old is not None and old != new:  # a known request changes state
            self.set(rid, new)

    def request_keys(self, tokens: int) -> int:
        """Chunk keys (over all groups) a prefix of ``tokens`` tokens covers."""
        n = 0
        for t in self._chunk_tokens:
            n += tokens // t
        return n

    def after_alloc(self, rid: str, num_external_tokens: int, at: float = 0.0) -> None:
        if num_external_tokens:
            self.set(rid, LOADING, known_only=True)
            self.clock.on_alloc(rid, num_external_tokens, at)
            return
        old = self.state.get(rid)  # queued -> running, inlined: once per request
        if old == QUEUED:
            self.state[rid] = RUNNING
            self.counts[QUEUED] -= 1
            self.counts[RUNNING] += 1
        elif old is not None:
            self.set(rid, RUNNING)

    def on_finished(self, rid: str) -> None:
        old = self.state.pop(rid, None)
        if old is not None:
            self.counts[old] -= 1
            if old == DEFERRED:
                self.deferred.discard(rid)
            elif old == LOADING:
                self.loading.discard(rid)
        self.need.pop(rid, None)
        self.parked.discard(rid)
        self.clock.on_finished(rid)

    def on_step(self, scheduled: Collection[str], preempted: Any, at: float = 0.0) -> None:
        """A step ended: ``scheduled``, the ids it scheduled; ``preempted``, the ids it
        preempted (or None); ``at``, its perf_counter stamp."""
        self.clock.on_step(scheduled, at)
        # A deferred request is asked again every step it can be admitted; one
        # not asked this step sits behind capacity (queued), not behind us.
        looked_up = self.looked_up
        if self.deferred:
            for rid in [r for r in self.deferred if r not in looked_up]:
                self.set(rid, QUEUED)
                self.parked.add(rid)
        looked_up.clear()
        if self.loading and scheduled:  # a loading request vLLM schedules has its KV
            scheduled = set(scheduled)
            for rid in [r for r in self.loading if r in scheduled]:
                self.set(rid, RUNNING)
        for rid in preempted or ():
            self.set(rid, QUEUED, known_only=True)

    # ---- readers -------------------------------------------------------------------------
    def restoring_others(self, rid: str) -> list[str]:
        """Requests other than ``rid`` waiting on a restore (rare: row-ceiling rounds):
        deferred, loading, or deferred and not asked again since (parked)."""
        parked = self.parked
        return [r for r, st in self.state.items()
                if (st in _RESTORING or r in parked) and r != rid]
