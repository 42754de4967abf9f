"""The connector's memory of store jobs refused for lack of space (no vLLM needed)."""

from __future__ import annotations

from kvscope.connector.tiers.store_refusals import RefusedStores


def test_a_refused_key_is_remembered_until_a_job_holding_it_is_prepared():
    r = RefusedStores()
    r.refused([b"a", b"b"])
    assert b"a" in r and b"b" in r and b"c" not in r
    r.refused([b"a", b"b", b"c"])  # vLLM retries the job grown by the next step's chunks
    assert len(r) == 3
    r.prepared([b"a", b"b"])  # stored now (or already held)
    assert b"a" not in r and b"b" not in r and b"c" in r


def test_memory_is_bounded_oldest_first():
    r = RefusedStores(cap=3)
    r.refused([b"1", b"2"])
    r.refused([b"3", b"4"])
    assert len(r) == 3 and b"1" not in r and b"4" in r
    r.refused([b"1"])  # still being refused: back with its next refusal
    assert b"1" in r and b"2" not in r


def test_the_cpu_tier_alone_forgets_a_refusal_once_it_cycled_through_its_rows():
    """A key stored at the refusal would have been evicted by now: the refusal no
    longer explains why it is missing."""
    r = RefusedStores(forget_after=4)
    r.refused([b"k"])
    r.prepared([b"x"], evicted=3)
    assert b"k" in r
    r.prepared([b"y"], evicted=1)
    assert b"k" not in r
    r.refused([b"k"])  # refused again: the clock restarts
    assert b"k" in r


def test_with_a_secondary_tier_refusals_are_never_forgotten_by_evictions():
    r = RefusedStores(forget_after=None)
    r.refused([b"k"])
    r.prepared([b"x"], evicted=10_000)  # evictions cascade to disk: nothing is dropped
    assert b"k" in r
