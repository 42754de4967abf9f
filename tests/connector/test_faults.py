"""The test-only fault hooks (kvscope/sim/faults.py) on vLLM's real scheduler on CPU.

Each fault is judged by what the engine did (outputs, tokens restored, work still
pending, files on the fs tier), then by what kvscope exported about it. The CPU
harness (``kvscope/sim/cpu_engine.py``) runs two simulated ranks in one process,
so the switch file is shared exactly as it is between a GPU server's processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import replace

import pytest

from kvscope.exporters import signals as S
from kvscope.exporters.prometheus import start_exporter
from kvscope.sim import faults
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt
from tests.connector.support import Exposition

pytestmark = pytest.mark.vllm

TOKENS = 96  # 6 chunks of 16 tokens
CFG = EngineConfig(rows=12, kv_groups=1, world_size=2, num_gpu_blocks=16,
                   max_num_batched_tokens=16, fault_hooks=True)


@pytest.fixture
def switch(monkeypatch, tmp_path):
    path = str(tmp_path / "fault.json")
    monkeypatch.setenv(faults.ENV, path)
    faults.write_fault(path, None)
    return path


def set_fault(path: str, fault: str | None, rank: int = 1) -> None:
    faults.write_fault(path, fault, rank)


@pytest.fixture(autouse=True)
def _poll_now(monkeypatch):
    monkeypatch.setattr(faults, "POLL_S", 0.0)  # the CPU engine steps faster than a poll


@contextlib.contextmanager
def engine(**kw):
    e = CPUEngine(replace(CFG, **kw))
    recorders = [e.connector.kvscope_recorder, *(r.connector.kvscope_recorder for r in e.ranks)]
    exporter = start_exporter(recorders, 0)
    try:
        yield e, lambda: Exposition.scrape(exporter.url)
    finally:
        exporter.close()
        e.close()


def flood(e: CPUEngine, n: int = 3) -> None:
    for seed in range(100, 100 + n):  # evict the target from the GPU and the CPU tier
        e.generate(prompt(seed, TOKENS), 2)
        e.drain()


def ask_flood_reask(e: CPUEngine, between=lambda: None):
    """Ask the target, flood it out of the GPU and CPU tiers, run ``between`` (the fault),
    ask it again: (first, again), the engine drained after each ask."""
    target = prompt(1, TOKENS)
    first = e.generate(target, 4)
    e.drain()
    flood(e)
    between()
    again = e.generate(target, 4)
    e.drain()
    return first, again


def stored_files(e: CPUEngine) -> int:
    return sum(f.endswith(".bin") for _, _, files in os.walk(e.fs_root) for f in files)


# Both ranks map the scheduler's own region file here, and these faults change a rank's slot
# in that file in place: only checksum_scope "all" digests ranks that share the file
# (connector/integrity/shared_region.py).
ALL_RANKS = {"checksum_scope": "all"}


@pytest.mark.parametrize("fault", [faults.FLIP_PROMOTED, faults.DROP_PROMOTION])
@pytest.mark.parametrize("policy", ["observe", "refuse"])
def test_corrupted_promotion_on_rank_1(switch, fault, policy):
    with engine(checksum_policy=policy, kvscope_options=ALL_RANKS) as (e, scrape):
        first, again = ask_flood_reask(e, lambda: set_fault(switch, fault, rank=1))
        ex = scrape()
    if policy == "observe":  # engine truth: restored from disk, rank 1's wrong bytes served
        assert again.num_external_tokens == TOKENS
        assert again.output != first.output
    else:  # refused: vLLM recomputed the prompt (nothing external kept), same tokens
        assert again.num_external_tokens == 0
        assert again.output == first.output
    assert ex.value(S.ROW_CHECKSUMS.name, rank="1", outcome="mismatch") > 0
    assert ex.value(S.ROW_CHECKSUMS.name, rank="0", outcome="mismatch") == 0
    assert ex.value(S.ROW_CHECKSUMS.name, rank="0", outcome="match") > 0
    refused = ex.value(S.LOADS_REFUSED.name, rank="1", reason="checksum_mismatch")
    assert (refused > 0) if policy == "refuse" else (refused == 0)


def test_no_fault_file_no_effect(switch):
    with engine() as (e, scrape):
        first, again = ask_flood_reask(e)
        ex = scrape()
    assert again.num_external_tokens == TOKENS and again.output == first.output
    assert ex.value(S.ROW_CHECKSUMS.name, outcome="mismatch") == 0


def test_the_served_connector_ignores_a_switched_on_fault(switch):
    """kvscope's own connector, built while the switch names a fault: no hook is installed
    (kvscope.sim.fault_connector's subclass installs them), so the flipped slot is never
    flipped, a finish is never lost and the restore is whole."""
    from kvscope.connector.lookup.round_verdicts import RoundVerdicts
    from kvscope.connector.observed import ObservedOffloadingConnector
    from kvscope.connector.worker.proxy import WorkerProxy

    set_fault(switch, faults.FLIP_PROMOTED, rank=1)
    with engine(fault_hooks=False, checksum_policy="refuse",
                kvscope_options=ALL_RANKS) as (e, scrape):
        obs = e.connector._kvscope_observer
        assert type(e.connector) is ObservedOffloadingConnector
        assert all(type(r.connector) is ObservedOffloadingConnector for r in e.ranks)
        assert type(obs._live) is set
        assert obs.verdicts.record.__func__ is RoundVerdicts.record
        assert all(type(r.connector.kvscope_worker) is WorkerProxy
                   and not isinstance(r.connector.kvscope_worker._inner,
                                      faults._WithholdingWorker) for r in e.ranks)
        first, again = ask_flood_reask(e)
        ex = scrape()
    assert again.num_external_tokens == TOKENS and again.output == first.output
    assert ex.value(S.ROW_CHECKSUMS.name, rank="1", outcome="match") > 0
    assert ex.value(S.ROW_CHECKSUMS.name, outcome="mismatch") == 0


def test_ranks_sharing_the_scheduler_region_cost_no_digest(switch):
    """Default scope: both ranks map the scheduler's own region file, so the promotion is
    digested for neither and no load is compared, yet the restore is whole and right."""
    with engine(checksum_policy="refuse") as (e, scrape):
        first, again = ask_flood_reask(e)
        ex = scrape()
        expected = dict(e.connector._kvscope_observer.rows.expected)
    assert again.num_external_tokens == TOKENS and again.output == first.output
    assert ex.value(S.PROMOTIONS.name, result="completed") > 0
    assert ex.value(S.CHECKSUM_RANKS.name, check="shared_region") == 2
    assert ex.value(S.CHECKSUM_RANKS.name, check="digested") == 0
    assert expected == {}
    assert ex.value(S.ROW_CHECKSUMS.name) == 0


def test_stalled_reads_hold_the_request_until_cleared(switch):
    with engine() as (e, scrape):
        target = prompt(1, TOKENS)
        first = e.generate(target, 4)
        e.drain()
        flood(e)
        set_fault(switch, faults.STALL_READS)
        rid = e.add_request(target, 4)
        for _ in range(30):
            e.step()
        e.refresh()
        stalled = scrape()
        assert rid not in e.finished  # engine truth: waiting for a promotion that never lands
        set_fault(switch, None)
        e.run_until_done([rid])
        e.drain()
        after = scrape()
        again = e.finished[rid]
        assert not e.scheduler.has_requests()
    assert again.output == first.output and again.num_external_tokens == TOKENS
    assert stalled.value(S.PENDING_TRANSFERS.name, kind="promotion") > 0
    assert after.value(S.PENDING_TRANSFERS.name) == 0


def test_stalled_writes_keep_cascades_pending_until_cleared(switch):
    with engine() as (e, scrape):
        set_fault(switch, faults.STALL_WRITES)
        target = prompt(1, TOKENS)
        first = e.generate(target, 4)
        for _ in range(5):
            e.step()
        e.refresh()
        stalled = scrape()
        assert stored_files(e) == 0  # engine truth: nothing reached disk
        set_fault(switch, None)
        e.drain()
        assert stored_files(e) >= TOKENS // 16
        flood(e)
        again = e.generate(target, 4)
        e.drain()
        after = scrape()
    assert again.output == first.output and again.num_external_tokens == TOKENS
    assert stalled.value(S.PENDING_TRANSFERS.name, kind="cascade") > 0
    assert after.value(S.PENDING_TRANSFERS.name) == 0


def test_withheld_store_keeps_the_engine_busy_until_cleared(switch):
    with engine() as (e, scrape):
        set_fault(switch, faults.WITHHOLD_STORE, rank=1)
        out = e.generate(prompt(1, TOKENS // 2), 2)
        for _ in range(10):
            e.step()
        e.refresh()
        stalled = scrape()
        # engine truth: the request is answered, yet the engine still has work
        assert out.request_id in e.finished and e.scheduler.has_requests()
        set_fault(switch, None)
        e.drain()
        assert not e.scheduler.has_requests()
        after = scrape()
    assert stalled.value(S.PENDING_TRANSFERS.name, kind="store") > 0
    assert stalled.value(S.TRANSFERS_IN_FLIGHT.name, rank="1", direction="gpu_to_cpu") > 0
    assert stalled.value(S.TRANSFERS_IN_FLIGHT.name, rank="0", direction="gpu_to_cpu") == 0
    assert after.value(S.PENDING_TRANSFERS.name) == 0


def test_fs_tier_directory_removed_mid_run(switch):
    with engine() as (e, scrape):
        first, again = ask_flood_reask(e, lambda: shutil.rmtree(e.fs_root))
        assert not e.scheduler.has_requests()
        ex = scrape()
    # engine truth: nothing to restore any more; recomputed, same tokens
    assert again.num_external_tokens == 0 and again.output == first.output
    assert ex.value(S.PENDING_TRANSFERS.name) == 0


def test_fs_tier_disk_full(switch):
    mnt = tempfile.mkdtemp(prefix="kvscope-tmpfs-")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt],
                      capture_output=True).returncode != 0:
        os.rmdir(mnt)
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        with engine(fs_root=os.path.join(mnt, "kv")) as (e, scrape):
            with open(os.path.join(mnt, "ballast"), "wb", buffering=0) as f:  # fill it, mid-run
                with contextlib.suppress(OSError):
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
            target = prompt(1, TOKENS)
            first = e.generate(target, 4)
            e.drain()
            flood(e)
            again = e.generate(target, 4)
            e.drain()
            assert not e.scheduler.has_requests()
            ex = scrape()
    finally:
        subprocess.run(["umount", mnt], capture_output=True)
        os.rmdir(mnt)
    assert again.num_external_tokens == 0 and again.output == first.output
    assert ex.value(S.CASCADES.name, result="failed") > 0
    assert ex.value(S.CASCADES.name, result="completed") == 0
    assert ex.value(S.PENDING_TRANSFERS.name) == 0


@pytest.mark.parametrize("options", [{"checksum_threads": 3}, {"checksum_algorithm": "crc32"}],
                         ids=["digests-over-3-threads", "crc32"])
@pytest.mark.parametrize("fault", [None, faults.FLIP_PROMOTED])
def test_checksum_options_still_catch_a_flipped_slot(switch, monkeypatch, options, fault):
    """Digests split over threads (every batch, however small) or another algorithm: an
    intact promotion is served, a flipped slot is refused on its rank only."""
    from kvscope.connector.integrity import checksums

    monkeypatch.setattr(checksums, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(checksums, "PARALLEL_MIN_ROW_BYTES", 0)
    with engine(checksum_policy="refuse", kvscope_options={**options, **ALL_RANKS}) \
            as (e, scrape):
        first, again = ask_flood_reask(e, lambda: set_fault(switch, fault, rank=1))
        ex = scrape()
    assert again.output == first.output
    assert ex.value(S.ROW_CHECKSUMS.name, rank="0", outcome="match") > 0
    assert ex.value(S.ROW_CHECKSUMS.name, rank="0", outcome="mismatch") == 0
    if fault is None:  # engine truth: restored from disk, every row verified and matching
        assert again.num_external_tokens == TOKENS
        assert ex.value(S.ROW_CHECKSUMS.name, rank="1", outcome="match") > 0
        assert ex.value(S.ROW_CHECKSUMS.name, outcome="mismatch") == 0
        assert ex.value(S.LOADS_REFUSED.name) == 0
    else:  # refused on rank 1, recomputed by vLLM
        assert again.num_external_tokens == 0
        assert ex.value(S.ROW_CHECKSUMS.name, rank="1", outcome="mismatch") > 0
        assert ex.value(S.LOADS_REFUSED.name, rank="1", reason="checksum_mismatch") > 0
