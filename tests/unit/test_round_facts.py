"""A plain round's summary (lookup.rounds.summarize, taken on the scheduler thread so the
journal carries O(groups) objects per round, not the lookups) tells judging what the whole
round (Round) tells: verdict, pending keys, where each group's scan stopped, the lookup
counts per group and result; on random rounds of one and of three KV groups, with lookups
before the round's start. And a rare round's self-evictions, counted in one pass, equal
the definition (rows found before each eviction that it evicted), on rounds of thousands
of keys."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kvscope.connector import compat
from kvscope.connector.lookup.rounds import _SUFFIX, LookupCounts, LookupLog, Round, summarize

pytest.importorskip("vllm")

RESULTS = (compat.HIT, compat.MISS, compat.RETRY, compat.HIT_PENDING)


def _suffix(g: int) -> bytes:
    return g.to_bytes(compat.GROUP_SUFFIX_BYTES, "big")


def _round(rng: random.Random, groups: int) -> tuple[list[bytes], list, int]:
    n = rng.randrange(0, 60)
    keys = [rng.randbytes(8) + _suffix(rng.randrange(groups)) for _ in range(n)]
    weights = rng.choice(((5, 1, 1, 1), (1, 0, 0, 0), (0, 1, 0, 0), (3, 0, 2, 2), (1, 1, 0, 0)))
    results = rng.choices(RESULTS, weights, k=n)
    return keys, results, rng.choice((0, 0, rng.randrange(0, n + 1)))


@pytest.mark.parametrize("groups", [1, 3])
def test_summary_tells_what_the_round_tells(groups):
    rng = random.Random(groups)
    counts = LookupCounts(_suffix(0) if groups == 1 else None)
    for _ in range(3000):
        keys, results, start = _round(rng, groups)
        facts = summarize(keys, results, start, groups > 1)
        whole = Round.plain(keys, results, start)
        for num_tokens in (None, 0, 16):
            assert facts.verdict(num_tokens) == whole.verdict(num_tokens)
        assert facts.pending_keys == whole.pending_keys
        assert facts.first_miss_key() == whole.first_miss_key()
        if groups > 1:
            assert facts.first_miss() == whole.first_miss()
        else:
            assert facts.first_miss() == {k[-compat.GROUP_SUFFIX_BYTES:]: v
                                          for k, v in whole.first_miss().items()}
        assert not facts.at_row_ceiling(1)
        want = Counter(zip(map(_SUFFIX, keys), map(id, results)))
        assert dict(counts.tally(keys, results)) == {k: n for k, n in want.items() if n}


def test_self_evictions_counted_in_one_pass_equal_their_definition():
    rng = random.Random(7)
    for n in (0, 50, 1500):
        log = LookupLog()
        log.begin()
        keys = [rng.randbytes(8) + _suffix(0) for _ in range(n)]
        for i, key in enumerate(keys):
            if i and rng.random() < 0.3:  # a promotion in this lookup evicts rows
                log.add_evictions([rng.choice(keys[:i]) if rng.random() < 0.7
                                   else rng.randbytes(12) for _ in range(rng.randrange(1, 4))])
            log.keys.append(key)
            log.results.append(rng.choice(RESULTS))
        rnd, _, _ = log.end()
        # the definition: per eviction, the keys found among the lookups before it
        want = sum(sum(k in rnd.found(i) for k in evicted) for i, evicted in rnd.evictions)
        assert rnd.self_evicted() == want
        assert n < 50 or want > 0
