"""Promotions (disk -> CPU) still in flight for a fixed number of engine steps after they start.

Beside a real engine the fs tier's reads finish whenever the disk is done, so whether a
promotion is still in flight at the next lookup is a race. Some incidents exist only when
it is: the row ceiling's truncated form (``scenarios.truncated``) needs a round to find
every primary row pinned by promotions still running, which tiers settled every step never
give (the re-ask livelocks) and racing tiers give only most of the time. Holding each
promotion until the end of the ``steps``-th step after the one that started it, then settling
the tier as usual, makes that timing repeatable: the lookups of the next ``steps`` steps find it
in flight, the one after finds it done (a disk slower than a forward, by a fixed amount).

Wraps the fs tier's thread pool instance (``enqueue_load``; instance-attribute shadowing),
beneath the tier and kvscope's taps on it: vLLM and kvscope see the promotion start when
vLLM starts it, only the disk is slower. Jobs reach the pool in submission order.

:class:`CompletionsAtStepEnd` is the other half of that clock on a settled engine: the
tier's finished jobs reach vLLM as of each step's end, in submission order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class DelayedPromotions:
    def __init__(self, pool: Any, steps: int) -> None:
        self._submit = pool.enqueue_load
        self._steps = steps
        self._held: list[list[Any]] = []  # [steps left, args, kwargs], submission order
        pool.enqueue_load = self._hold

    def _hold(self, *args: Any, **kwargs: Any) -> None:
        self._held.append([self._steps, args, kwargs])

    def tick(self) -> None:
        """One engine step ended: hand the I/O threads the promotions now due."""
        for held in self._held:
            held[0] -= 1
        self._release(lambda held: held[0] < 0)

    def release_all(self) -> None:
        """Nothing left to step (drained): no promotion stays held."""
        self._release(lambda held: True)

    def _release(self, due) -> None:
        ready = [h for h in self._held if due(h)]
        self._held = [h for h in self._held if not due(h)]
        for _, args, kwargs in ready:
            self._submit(*args, **kwargs)


class CompletionsAtStepEnd:
    """The fs tier's finished jobs, seen by vLLM only as of the last step's end.

    Settling the tier after each step makes every job of a step done by the next, but a
    job started inside ``schedule()`` (a promotion at one request's lookup, a cascade)
    may also finish before a later lookup of the same ``schedule()`` call, whose poll
    then frees or readies its rows: whether it did depends on the I/O threads' timing
    against the scheduler's loop (on a loaded 2-core machine one restore more or fewer
    fits, with stock vLLM as with kvscope). Handing vLLM the jobs finished by the
    settle point, and holding any that finish later until the next one, makes "done by
    the next step" exact. Wraps the pool instance's ``get_finished`` (instance-attribute
    shadowing), beneath the tier and kvscope's taps.
    """

    def __init__(self, pool: Any) -> None:
        self._collect: Callable[[], list] = pool.get_finished
        self._ready: list = []
        pool.get_finished = self._get_finished

    def _get_finished(self) -> list:
        ready, self._ready = self._ready, []
        return ready

    def step_ended(self) -> None:
        """The tier is settled: what finished so far is vLLM's from now on."""
        # in submission order (job ids count up), not the threads' finishing order: vLLM
        # makes a cascaded row evictable as it collects the job, so that order is the rows'
        # LRU order, and with it which rows the next stores evict
        self._ready.extend(sorted(self._collect(), key=lambda job: job[0]))
