"""Transfers vLLM's own worker reports failed (vLLM >= 0.34), counted per rank.

vLLM 0.34's offloading worker takes a ``TransferResult`` with ``success=False``: a failed
asynchronous load's request comes back through ``failed_recving``, vLLM recomputes it
(``kv_load_failure_policy`` recompute) and never loads that request from the offloaded cache
again. Earlier releases assert every transfer succeeded. Here the CPU harness's copy worker
(what plays the GPU) fails one rank's load, as a copy that raised would; the truth is the
harness's own count of the failures it reported, and what the engine did with the re-ask.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvscope.exporters import signals as S
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

pytestmark = pytest.mark.vllm

TOKENS = 96
CFG = EngineConfig(rows=64, world_size=2, num_gpu_blocks=40, max_num_batched_tokens=64)


def _failed_transfers_supported() -> bool:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
        OffloadingConnectorWorker,
    )

    return hasattr(OffloadingConnectorWorker, "take_failed_recving")


@pytest.mark.parametrize("connector", ["ObservedOffloadingConnector", "OffloadingConnector"])
def test_a_failed_load_is_recomputed_and_counted_on_its_rank(connector):
    if not _failed_transfers_supported():
        pytest.skip("this vLLM asserts every transfer succeeded (failed transfers: 0.34)")
    failed: list[tuple[int, int]] = []  # (rank, job id) the harness reported failed
    armed = [False]

    def fail(rank: int, kind: str, job_id: int) -> bool:
        if armed[0] and rank == 1 and kind == "load":
            failed.append((rank, job_id))
            return True
        return False

    with CPUEngine(replace(CFG, failed=fail, connector=connector)) as e:
        target = prompt(1, TOKENS)
        first = e.generate(target, 4)
        e.drain()
        for seed in range(2, 6):  # out of the GPU prefix cache, kept in the CPU tier
            e.generate(prompt(seed, TOKENS), 2)
            e.drain()
        armed[0] = True
        again = e.generate(target, 4)
        e.drain()
        armed[0] = False
        after = e.generate(target, 4)  # the next ask of the same prompt
        e.drain()
        counted = [r.connector.kvscope_recorder.value(S.TRANSFERS_FAILED, (str(r.rank), d))
                   for r in e.ranks for d in (S.Direction.GPU_TO_CPU.value,
                                              S.Direction.CPU_TO_GPU.value)] \
            if connector == "ObservedOffloadingConnector" else None
        scheduler_has_requests = e.scheduler.has_requests()
    assert failed, "the re-ask loaded nothing from the CPU tier: no load to fail"
    assert again.output == first.output  # recomputed, not served from unloaded blocks
    assert after.output == first.output
    assert after.num_external_tokens > 0  # the next request restores from the tier again
    assert not scheduler_has_requests
    if counted is not None:  # rank 0: nothing; rank 1: its failed loads, no failed store
        assert counted == [0, 0, 0, len(failed)]
