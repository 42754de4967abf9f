"""Keys whose store job the primary tier refused for lack of space (``no_space``).

A lookup round whose offer stopped at a key no tier holds cannot tell, from the
lookup alone, a prefix never offered to the tiers (benign ``not_stored``) from
one whose store was refused (``store_refused``: the prompt was stored only in
part and its re-ask recomputes the rest). The store path knows: vLLM retries a
refused job's keys (grown by the next step's chunks) until one fits, so a key
still remembered here was refused and not stored since.

A refusal explains a later miss only if the key, had it been stored, would still
be held. With a secondary tier nothing stored is dropped (evictions cascade to
disk). With the CPU tier alone evictions drop keys: once the tier has evicted as
many keys as it has rows since the refusal, a key stored then would be gone too
(its row was the newest then), so the refusal no longer explains anything.

Bounded: at most ``cap`` keys, oldest first out (a key still being refused comes
back with its next refusal); a key leaves as soon as a store job holding it is
prepared (stored now, or already held). Work per store job: one C-level update
on a refusal, a dict pop per key of a prepared job only while anything is
remembered, an addition when a job evicts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

# ~100 bytes a key (a 36-byte key, its dict entry): a few MiB at the cap, which
# is far more chunks than a primary tier's rows refuse between two asks.
CAP = 1 << 15


class RefusedStores:
    __slots__ = ("keys", "cap", "forget_after", "evicted")

    def __init__(self, cap: int = CAP, forget_after: int | None = None) -> None:
        """``forget_after``: evictions after which a refusal is forgotten (the CPU tier
        alone: its row count); None: never (evictions cascade to a secondary tier)."""
        # key -> evictions counted when it was (last) refused
        self.keys: OrderedDict[bytes, int] = OrderedDict()
        self.cap = cap
        self.forget_after = forget_after
        self.evicted = 0

    def __contains__(self, key: bytes) -> bool:
        stamp = self.keys.get(key)
        if stamp is None:
            return False
        return self.forget_after is None or self.evicted - stamp < self.forget_after

    def __len__(self) -> int:
        return len(self.keys)

    def refused(self, keys: Collection[bytes]) -> None:
        """A store job of ``keys`` was refused: none of them reached a tier."""
        held = self.keys
        held.update(dict.fromkeys(keys, self.evicted))
        for _ in range(len(held) - self.cap):
            held.popitem(last=False)

    def prepared(self, keys: Collection[bytes], evicted: int = 0) -> None:
        """A store job of ``keys`` was prepared (each is stored or already held); it
        evicted ``evicted`` keys from the primary tier."""
        self.evicted += evicted
        if self.keys:
            pop = self.keys.pop
            for key in keys:
                pop(key, None)
