"""The rows a lookup round's promotions evicted, kept flat.

A promotion that evicted rows is noted as the index of the lookup in progress (``at``) and
how many keys it evicted (``n``); the keys themselves go, in order, into one list
(``keys``). Ints and keys only, no object per eviction: a long restore's promoting scan
starts ~8,190 promotions and, with the primary tier full, each evicts a row. An object
kept per eviction (a tuple, vLLM's list of the evicted keys, its answer) is a tracked
allocation that outlives the scan: vLLM's own scan leaves none, so every collection that
runs during it (~80 in a 131k restore on CPU, one of them a full one) would be kvscope's.
Iterating gives ``(index, keys)`` pairs, for the rare rounds judged from them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence


class Evictions:
    __slots__ = ("at", "n", "keys")

    def __init__(self, at: list[int] | None = None, n: list[int] | None = None,
                 keys: list[bytes] | None = None) -> None:
        # never rebound: the primary tier's tap holds their bound appends (tiers/taps.py)
        self.at: list[int] = [] if at is None else at
        self.n: list[int] = [] if n is None else n
        self.keys: list[bytes] = [] if keys is None else keys

    def __bool__(self) -> bool:
        return bool(self.at)

    def __len__(self) -> int:
        """Promotions that evicted (not keys evicted: ``len(keys)``)."""
        return len(self.at)

    def __iter__(self) -> Iterator[tuple[int, list[bytes]]]:
        keys, k = self.keys, 0
        for i, c in zip(self.at, self.n):
            yield i, keys[k:k + c]
            k += c

    def add(self, at: int, keys: Sequence[bytes]) -> None:
        self.at.append(at)
        self.n.append(len(keys))
        self.keys.extend(keys)

    def extend(self, other: Evictions, by: int = 0) -> None:
        """``other``'s evictions appended, their indexes moved by ``by``."""
        self.at.extend(map(by.__add__, other.at) if by else other.at)
        self.n.extend(other.n)
        self.keys.extend(other.keys)

    def shifted(self, by: int) -> Evictions:
        """A copy, every index moved by ``by``."""
        return Evictions(list(map(by.__add__, self.at)) if by else self.at[:], self.n[:],
                         self.keys[:])

    def truncate(self, count: int) -> None:
        """Only the first ``count`` promotions' evictions kept."""
        if count < len(self.at):
            del self.keys[sum(self.n[:count]):]
            del self.at[count:], self.n[count:]

    def clear(self) -> None:
        self.at.clear()
        self.n.clear()
        self.keys.clear()
