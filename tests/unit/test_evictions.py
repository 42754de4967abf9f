"""The flat record of a round's evictions (connector/lookup/evictions.py) against its definition: a
list of (index of the lookup in progress, keys evicted) pairs, in the order noted."""

from __future__ import annotations

import random

from kvscope.connector.lookup.evictions import Evictions


def _noted(rng: random.Random, n: int) -> tuple[Evictions, list[tuple[int, list[bytes]]]]:
    ev, pairs = Evictions(), []
    for i in sorted(rng.sample(range(10 * n + 1), n)):
        keys = [rng.randbytes(8) for _ in range(rng.randrange(1, 4))]
        ev.add(i, keys)
        pairs.append((i, keys))
    return ev, pairs


def test_flat_evictions_read_back_as_the_pairs_noted():
    rng = random.Random(3)
    for n in (0, 1, 40):
        ev, pairs = _noted(rng, n)
        assert list(ev) == pairs and len(ev) == n and bool(ev) == bool(n)
        assert ev.keys == [k for _, ks in pairs for k in ks]
        assert list(ev.shifted(-5)) == [(i - 5, ks) for i, ks in pairs]
        assert list(ev) == pairs  # a shifted copy leaves the original alone
        for cut in (0, n // 2, n, n + 3):
            part, _ = _noted(random.Random(n), 0)
            part.extend(ev, 7)
            part.truncate(cut)
            assert list(part) == [(i + 7, ks) for i, ks in pairs[:cut]]
        ev.clear()
        assert not ev and list(ev) == [] and ev.keys == []
