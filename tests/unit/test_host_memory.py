"""The host's memory from /proc (connector/export/host_memory.py): this machine's own /proc, no vLLM."""

from __future__ import annotations

import os

import pytest

from kvscope.connector.export import host_memory as hm
from kvscope.exporters import signals as S

pytestmark = pytest.mark.skipif(not os.path.exists(hm.MEMINFO), reason="no /proc/meminfo")


def _kib(field: bytes) -> int:
    with open(hm.MEMINFO, "rb") as f:
        line = next(raw for raw in f if raw.startswith(field))
    return int(line.split()[1]) * 1024


def test_a_sample_reads_memavailable_and_this_process_rss():
    got = dict(hm.HostMemory().sample(now=0.0))
    available = got[(S.HOST_MEMORY_AVAILABLE, ())]
    resident = got[(S.PROCESS_RESIDENT_MEMORY, ())]
    # the host's own numbers, read again now (they move a little in between)
    assert 0 < available <= _kib(b"MemTotal:")
    assert abs(available - _kib(b"MemAvailable:")) < 256 << 20
    with open("/proc/self/status", "rb") as f:
        vmrss = next(int(raw.split()[1]) * 1024 for raw in f if raw.startswith(b"VmRSS:"))
    assert abs(resident - vmrss) < 64 << 20


def test_sampled_at_most_every_interval():
    host = hm.HostMemory(interval_s=5.0)
    assert host.due(now=100.0) and host.sample(now=100.0)
    assert not host.due(now=104.0) and host.sample(now=104.0) == []
    assert host.sample(now=105.0) and host.samples == 2


def test_what_proc_lacks_is_left_out(tmp_path):
    host = hm.HostMemory(meminfo=str(tmp_path / "none"), statm="/proc/self/statm")
    assert [key for key, _ in host.sample(now=0.0)] == [(S.PROCESS_RESIDENT_MEMORY, ())]
    assert hm.mem_available(b"MemTotal: 100 kB\nMemFree: 5 kB\n") is None
    assert hm.mem_available(b"MemTotal: 100 kB\nMemAvailable:  7 kB\n") == 7 * 1024
