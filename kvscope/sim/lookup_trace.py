"""What vLLM's scheduler did with each re-ask, step by step: a benchmark's trace.

``plan_verify.py engine --trace`` (GPU) and the CPU harness use it to see where restores cut
late, or restored late, came from: per step, the primary tier's rows (evictable, in flight,
occupied) as the step began; every lookup of a traced request and the connector's answer
(``None``: deferred; ``0``: cut at its first chunk; else tokens to load); every change of a
traced request's status. Engine truth read from vLLM's own objects, never kvscope's
counters; nothing here changes what the engine does.

Events (lists, to keep the JSON small):
  ``["step", step, evictable, in_flight, occupied]``
  ``["lookup", step, request, answer]``
  ``["status", step, request, status name, computed tokens]``
"""

from __future__ import annotations

from typing import Any

from kvscope.connector import compat


class LookupTrace:
    """Wraps one scheduler's ``schedule`` and its connector's lookup (instance attributes,
    this benchmark's engine only) while :attr:`on` is set."""

    def __init__(self, scheduler: Any) -> None:
        self.sched = scheduler
        self.conn = scheduler.connector
        self.primary = compat.primary_tier(self.conn.connector_scheduler.manager)
        self.events: list[list] = []
        self.index: dict[str, int] = {}  # traced request id -> its index in the wave
        self.step = 0
        self._status: dict[str, tuple] = {}
        schedule, lookup = scheduler.schedule, self.conn.get_num_new_matched_tokens

        def traced_schedule(*a, **kw):
            if self.index:
                self._step_begins()
            self.step += 1
            return schedule(*a, **kw)

        def traced_lookup(request, num_computed_tokens):
            got = lookup(request, num_computed_tokens)
            i = self._which(request.request_id)
            if i is not None:
                self.events.append(["lookup", self.step, i, got[0]])
            return got

        scheduler.schedule = traced_schedule
        self.conn.get_num_new_matched_tokens = traced_lookup

    def follow(self, request_ids: list[str]) -> None:
        """Trace these requests (a wave's re-asks, in order) from the next step."""
        self.index = {r: i for i, r in enumerate(request_ids)}
        self._status = {}

    def stop(self) -> list[list]:
        events, self.events, self.index = self.events, [], {}
        return events

    def _which(self, rid: str) -> int | None:
        i = self.index.get(rid)
        if i is None:  # vLLM 0.33 suffixes the ids it is given
            i = self.index.get(rid.rsplit("-", 1)[0])
        return i

    def _step_begins(self) -> None:
        total, occupied, in_flight = compat.row_states(self.primary)
        evictable = compat.evictable_rows(self.primary)
        self.events.append(["step", self.step, evictable, in_flight, occupied])
        for rid, req in list(self.sched.requests.items()):
            i = self._which(rid)
            if i is None:
                continue
            now = (req.status.name, int(req.num_computed_tokens))
            if self._status.get(rid) != now:
                self._status[rid] = now
                self.events.append(["status", self.step, i, *now])
