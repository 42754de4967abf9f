"""Store jobs as kvscope's journal records them, on vLLM's real scheduler on CPU.

With the CPU tier alone, a refused store stops explaining a later miss once the tier has
evicted as many keys as it has rows (``store_refusals.RefusedStores``): the evictions
each prepared store job reports are what it counts. The journal keeps only those counts,
not vLLM's output object. The oracle is the geometry: distinct full blocks stored into an
LRU tier of ``ROWS`` rows evict all but ``ROWS`` of them.
"""

from __future__ import annotations

import pytest

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

pytestmark = pytest.mark.vllm

ROWS = 8
TOKENS = 64  # 4 full blocks of 16 tokens per prompt; its 4 decoded tokens fill none


@pytest.mark.parametrize("prompts", [3, 5])
def test_the_evictions_of_prepared_store_jobs_are_counted(prompts):
    with CPUEngine(EngineConfig(rows=ROWS, tiering=False)) as e:
        for i in range(prompts):
            e.generate(prompt(10 + i, TOKENS), 4)
            e.drain()
        stored = prompts * TOKENS // e.cfg.block_size
        assert e.connector._kvscope_observer.refused_stores.evicted == stored - ROWS
