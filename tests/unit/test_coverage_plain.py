"""judge_plain_single is judge() for the common round (one full-attention KV group, no
refused promotion, no quarantined key): both must give the same Coverage for every
shape of such a round, including the edges (nothing computed, everything computed,
computed past the keys, a MISS key vLLM's scan never reached, the MISS key's store
refused or another key's)."""

from __future__ import annotations

import itertools

import pytest

from kvscope.connector import compat
from kvscope.connector.lookup.coverage import MissCause, group_suffixes, judge, judge_plain_single
from kvscope.exporters.signals import ShortReason, Verdict

SUFFIX = group_suffixes([(16, False)])[0][0]


def _keys(n: int) -> list[bytes]:
    return [bytes([i + 1]) * 8 + SUFFIX for i in range(n)]


@pytest.mark.parametrize("tpc", [16, 64])
def test_plain_single_group_equals_judge(tpc):
    stranger = b"\xff" * 8 + SUFFIX  # a MISS key not among the request's keys
    reasons: set = set()
    for n in range(0, 6):
        keys = _keys(n)
        for computed, miss, offered, verdict, refused in itertools.product(
                range(0, (n + 2) * tpc, tpc // 2),
                [None, stranger, *keys],
                range(0, (n + 1) * tpc, tpc),
                (Verdict.HIT, Verdict.MISS, Verdict.VETOED),
                ((), {stranger}, set(keys[:1]), set(keys[1:]))):
            first_miss = {} if miss is None else {SUFFIX: (miss, MissCause.ABSENT)}
            want = judge(first_miss=first_miss, scanned=frozenset(), verdict=verdict,
                         offered=offered, num_computed=computed,
                         groups=[(SUFFIX, tpc, False)], keys_by_group=[keys], manager=None,
                         refused_stores=refused)
            got = judge_plain_single(keys, tpc, miss, verdict, offered, computed, refused)
            assert got == want, (n, computed, miss, offered, verdict, refused)
            reasons.add(got.reason)
    assert reasons == {None, *[r for r in ShortReason if r in (
        ShortReason.NOT_STORED, ShortReason.STORE_REFUSED, ShortReason.GROUP_VETO,
        ShortReason.LOAD_CAP, ShortReason.OTHER)]}  # every reason such a round can have
    assert len(SUFFIX) == compat.GROUP_SUFFIX_BYTES
