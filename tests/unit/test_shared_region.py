"""Which ranks share the scheduler's region file: identities, markers, the scheduler's view.

Regions here are real files opened the way vLLM's SharedOffloadRegion opens its
``/dev/shm`` file (a path and an fd); the engine-level tests (tests/connector/
test_worker_side.py, test_faults.py) run vLLM's own regions.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from kvscope.connector.integrity.shared_region import (
    ChecksumScope,
    SharedRanks,
    marker_path,
    region_identity,
    remove_marker,
    write_marker,
)


def region(path: str) -> SimpleNamespace:
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
    return SimpleNamespace(mmap_path=path, fd=os.open(path, os.O_RDWR))


@pytest.fixture
def files(tmp_path):
    opened: list[SimpleNamespace] = []

    def make(name: str) -> SimpleNamespace:
        r = region(str(tmp_path / name))
        opened.append(r)
        return r

    yield make
    for r in opened:
        os.close(r.fd)


def test_same_file_same_identity_other_file_other(files):
    a, a_again, b = files("a.mmap"), files("a.mmap"), files("b.mmap")
    assert region_identity(a) is not None
    assert region_identity(a) == region_identity(a_again)
    assert region_identity(a) != region_identity(b)


def test_no_file_no_identity(tmp_path):
    assert region_identity(SimpleNamespace(mmap_path=str(tmp_path / "gone"), fd=None)) is None
    assert region_identity(object()) is None


def test_a_file_replaced_under_the_same_path_is_another_file(files, tmp_path):
    old = files("r.mmap")
    before = region_identity(old)
    os.unlink(old.mmap_path)
    new = files("r.mmap")  # a new engine with the same engine id
    assert region_identity(new) != before


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_ranks_marked_next_to_the_scheduler_file_are_shared(files):
    sched = files("engine.mmap")
    clock = Clock()
    ranks = SharedRanks(sched, world_size=3, clock=clock)
    assert ranks.to_digest() == (0, 1, 2)  # no marker yet: every rank digested
    m0 = write_marker(files("engine.mmap"), 0)  # rank 0 maps the same file
    other = files("node1.mmap")  # rank 2 maps another file (another node's /dev/shm) ...
    with open(marker_path(sched.mmap_path, 2), "w") as f:  # ... and a marker claims rank 2
        f.write(region_identity(other))
    assert ranks.to_digest() == (0, 1, 2)  # not looked at again before recheck_s
    clock.t += 1.0
    assert ranks.to_digest() == (1, 2)
    assert ranks.shared == {0}
    write_marker(files("engine.mmap"), 1)
    clock.t += 1.0
    assert ranks.to_digest() == (2,)
    remove_marker(m0)
    assert not os.path.exists(m0)
    clock.t += 1.0
    assert ranks.to_digest() == (2,)  # a rank maps one file for its life: still shared


def test_scope_all_digests_every_rank(files):
    sched = files("engine.mmap")
    write_marker(files("engine.mmap"), 0)
    ranks = SharedRanks(sched, world_size=1, scope=ChecksumScope.ALL)
    assert ranks.to_digest() == (0,)
    assert ranks.shared == frozenset()


def test_every_rank_shared_costs_a_tuple_read(files, monkeypatch):
    sched = files("engine.mmap")
    for r in range(2):
        write_marker(files("engine.mmap"), r)
    ranks = SharedRanks(sched, world_size=2, recheck_s=0.0)
    assert ranks.to_digest() == ()

    def no_reads(*a, **k):
        raise AssertionError("markers read again once every rank is known")

    monkeypatch.setattr(ranks, "_read_markers", no_reads)
    assert ranks.to_digest() == ()


def test_a_marker_is_written_whole(files):
    r = files("engine.mmap")
    path = write_marker(r, 5)
    assert path == marker_path(r.mmap_path, 5)
    with open(path) as f:
        assert f.read() == region_identity(r)
    assert not [p for p in os.listdir(os.path.dirname(path)) if p.endswith(".tmp")]
