"""vllm.LLM on a GPU with ObservedOffloadingConnector (skipped without CUDA).

Each test's case runs here and now, in a fresh subprocess (``python -m
kvscope.sim.gpu_e2e_cases NAME``: vLLM keeps process-wide state), so what is asserted is
what this checkout did on this GPU. The GPU end-to-end benchmark's committed record is
never read here.
"""

from __future__ import annotations

import json

import pytest

from kvscope.sim.gpu_e2e_cases import case_in_subprocess

pytestmark = pytest.mark.gpu

CASES = ("cpu-restore", "disk-restore", "ceiling")


def _results() -> dict:
    return {name: case_in_subprocess(name) for name in CASES}


@pytest.fixture(scope="module")
def results():
    return _results()


def _case(results: dict, name: str) -> dict:
    r = results[name]
    assert "error" not in r, json.dumps(r, indent=1)[-6000:]  # the case's exit code and tail
    return r


def _m(series: dict, name: str, **labels) -> float:
    want = json.dumps(dict(sorted(labels.items())), separators=(",", ":"))
    return sum(v for k, v in series.items()
               if k.startswith(name + "{") and (not labels or k == name + want))


def test_cpu_restore(results):
    r = _case(results, "cpu-restore")
    assert r["same_output"], r
    assert r["num_cached_tokens"] >= 1488
    rank0 = r["kvscope_rank0"]
    assert _m(rank0, "kvscope_transfer_bytes_total", direction="cpu_to_gpu", rank="0") > 0
    assert _m(r["kvscope_scheduler"], "kvscope_lookup_rounds_total", verdict="hit") >= 1
    assert _m(rank0, "kvscope_transfers_in_flight") == 0
    # one kvscope.transfer span per finished transfer job of the rank
    assert r["spans"]["kvscope.transfer"] == r["transfer_jobs_rank0"] > 0


def test_disk_restore_with_matching_checksums(results):
    r = _case(results, "disk-restore")
    assert r["same_output"], r
    assert r["num_cached_tokens"] >= 1488
    sched, rank0 = r["kvscope_scheduler"], r["kvscope_rank0"]
    assert _m(sched, "kvscope_transfer_bytes_total", direction="disk_to_cpu", rank="manager") > 0
    assert _m(rank0, "kvscope_transfer_bytes_total", direction="cpu_to_gpu", rank="0") > 0
    assert _m(rank0, "kvscope_row_checksums_total", outcome="match", rank="0") > 0
    assert _m(rank0, "kvscope_row_checksums_total", outcome="mismatch", rank="0") == 0
    assert r["spans"]["kvscope.promotion"] > 0


def test_capacity_ceiling_on_gpu(results):
    r = _case(results, "ceiling")
    assert r["same_output"], r  # recomputed, not restored
    sched = r["kvscope_scheduler"]
    assert _m(sched, "kvscope_hit_tokens_total") == 0
    assert _m(sched, "kvscope_rounds_at_row_ceiling_total") > 0
