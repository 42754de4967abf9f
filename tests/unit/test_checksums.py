"""Digests split over threads are the digests computed one by one, in order."""

from __future__ import annotations

import os
import threading

import pytest
import xxhash

from kvscope.connector.integrity import checksums
from kvscope.connector.integrity.checksums import ALGORITHMS, Digester


def test_xxh3_is_the_one_shot_value():
    # the streaming form (it releases the GIL in every xxhash version) must give the
    # same digest as xxh3_64_intdigest
    for size in (0, 1, 240, 241, 65536, 65537, 1 << 20):
        data = os.urandom(size)
        assert ALGORITHMS["xxh3"](memoryview(data)) == xxhash.xxh3_64_intdigest(data)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("sizes", [[], [4096], [4096] * 7, [1 << 20, 16, 300_000, 0, 70_000,
                                                             1 << 19, 5, 1 << 20]])
def test_many_equals_one_by_one(algorithm, threads, sizes):
    bufs = [memoryview(os.urandom(n)) for n in sizes]
    d = Digester(algorithm, threads, parallel_min_bytes=0, parallel_min_row_bytes=0)
    try:
        assert d.many(bufs) == [ALGORITHMS[algorithm](b) for b in bufs]
    finally:
        d.close()


def test_large_batches_run_on_several_threads(monkeypatch):
    seen: set[str] = set()
    barrier = threading.Barrier(3, timeout=10)  # passes only if 3 shares run at once

    def recording(buf):
        seen.add(threading.current_thread().name)
        barrier.wait()
        return len(buf)

    monkeypatch.setitem(ALGORITHMS, "recording", recording)
    d = Digester("recording", 3, parallel_min_bytes=0, parallel_min_row_bytes=0)
    try:
        bufs = [memoryview(b"x" * 10)] * 3
        assert d.many(bufs) == [10, 10, 10]
    finally:
        d.close()
    assert len(seen) == 3


def test_small_batches_stay_on_the_calling_thread(monkeypatch):
    seen: set[str] = set()

    def recording(buf):
        seen.add(threading.current_thread().name)
        return 0

    monkeypatch.setitem(ALGORITHMS, "recording", recording)
    d = Digester("recording", 4)  # default threshold: 4 MiB in one call
    assert d.many([memoryview(b"x" * 4096)] * 64) == [0] * 64
    assert seen == {threading.current_thread().name}
    assert d.parallel_min_bytes == checksums.PARALLEL_MIN_BYTES


def test_small_rows_stay_on_the_calling_thread(monkeypatch):
    """Past the batch threshold but rows under PARALLEL_MIN_ROW_BYTES each: one thread."""
    seen: set[str] = set()

    def recording(buf):
        seen.add(threading.current_thread().name)
        return len(buf)

    monkeypatch.setitem(ALGORITHMS, "recording", recording)
    small = checksums.PARALLEL_MIN_ROW_BYTES // 2
    rows = (checksums.PARALLEL_MIN_BYTES // small) * 2
    bufs = [memoryview(bytes(small))] * rows
    d = Digester("recording", 4)
    try:
        assert d.many(bufs) == [small] * rows
        assert seen == {threading.current_thread().name}
        big = [memoryview(bytes(checksums.PARALLEL_MIN_ROW_BYTES))] * 64  # 8 MiB of big rows
        assert d.many(big) == [checksums.PARALLEL_MIN_ROW_BYTES] * 64
        assert len(seen) > 1
    finally:
        d.close()


def test_auto_threads_is_bounded():
    assert 1 <= checksums.auto_threads() <= checksums.MAX_AUTO_THREADS
