"""kvscope_info{world_size} is the number of worker ranks the engine has, each of which
exports its own rank on the worker-side series: kv-diagnose holds the ranks it sees to it
(diagnostics/verdict/ranks.py). Real vLLM scheduler and worker ranks on CPU."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvscope.exporters import signals as S
from kvscope.exporters.prometheus import RecorderCollector
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig
from tests.connector.support import Exposition

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("world", [1, 2])
def test_kvscope_info_names_the_ranks_the_engine_built(world):
    cfg = EngineConfig(rows=8, kv_groups=1, world_size=world, num_gpu_blocks=32)
    with CPUEngine(cfg) as engine:
        engine.step()  # no request: the first step's flush exports info and the declared series
        engine.refresh()
        built = len(engine.ranks)
        reg = CollectorRegistry(auto_describe=False)
        reg.register(RecorderCollector([engine.connector.kvscope_recorder,
                                        *(r.connector.kvscope_recorder for r in engine.ranks)]))
        ex = Exposition(generate_latest(reg).decode())
    (info,) = ex.series(S.INFO.name)
    assert info[0][S.L_WORLD_SIZE] == str(built) == str(world)
    assert {lb[S.L_RANK] for lb, _ in ex.series(S.ROW_CHECKSUMS.name)} == \
        {str(r) for r in range(built)}
