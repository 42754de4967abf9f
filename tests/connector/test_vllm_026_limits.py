"""vLLM 0.26 behaviour the fault campaign ran into, pinned so the notes stay true.

The GPU campaign's stalled-read phase (docs/measured-facts.md) ended its server: the
client gave up on a request that waited for a promotion, vLLM aborted it, and the next
scheduler step died in vLLM's own offloading connector. Here the same with vLLM's stock
``OffloadingConnector`` (no kvscope at all) on vLLM's real scheduler on CPU. When this
test fails, vLLM has changed: revisit the docs/measured-facts.md note and the campaign's stalled-read phase.
"""

from __future__ import annotations

import pytest

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

pytestmark = pytest.mark.vllm


def test_aborting_a_request_that_waits_for_a_promotion_kills_the_scheduler():
    from vllm import __version__
    from vllm.v1.request import RequestStatus

    if not __version__.startswith("0.26."):
        pytest.skip(f"pinned to vLLM 0.26 behaviour, this is {__version__}")
    cfg = EngineConfig(rows=12, kv_groups=1, world_size=2, num_gpu_blocks=16,
                       max_num_batched_tokens=16, connector="OffloadingConnector")
    with CPUEngine(cfg) as e:
        target = prompt(1, 96)
        e.generate(target, 4)
        e.drain()
        for seed in range(100, 103):  # to disk, out of the GPU and CPU tiers
            e.generate(prompt(seed, 96), 2)
            e.drain()
        rid = e.add_request(target, 4)
        e.step()  # the lookup found it on disk: a promotion started, the request waits
        assert e.scheduler.requests[rid].status == RequestStatus.WAITING
        assert e.scheduler.requests[rid].num_computed_tokens == 0
        e.scheduler.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        with pytest.raises(AssertionError):
            for _ in range(5):
                e.step()
