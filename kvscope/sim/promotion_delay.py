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
"""

from __future__ import annotations

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
