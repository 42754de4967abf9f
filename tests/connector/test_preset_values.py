"""signals.PRESET_VALUES holds: from the first step on, before any request, every value
of each listed metric's closed labels is exported, for each value of its open labels.

kv-diagnose relies on it: a value missing from a series it reads is a partial export,
never a zero (diagnostics/evidence/partial.py). Real vLLM scheduler and worker ranks on CPU.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvscope.exporters import signals as S
from kvscope.exporters.prometheus import RecorderCollector
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig
from tests.connector.support import Exposition

pytestmark = pytest.mark.vllm


def _missing(ex: Exposition, m: S.Metric) -> list[str]:
    closed = [lb for lb in m.labels if lb in m.label_values]
    open_ = [lb for lb in m.labels if lb not in m.label_values]
    seen: dict[tuple, set[tuple]] = defaultdict(set)
    for labels, _ in ex.series(m.name):
        seen[tuple(labels.get(lb, "") for lb in open_)].add(
            tuple(labels.get(lb, "") for lb in closed))
    want = set(itertools.product(*(m.label_values[lb] for lb in closed)))
    return [f"{dict(zip(open_, o))} lacks {dict(zip(closed, v))}"
            for o, have in sorted(seen.items()) for v in sorted(want - have)]


@pytest.mark.parametrize("tiering", [True, False], ids=["tiering", "cpu"])
def test_every_preset_value_is_exported_from_the_first_step(tiering):
    cfg = EngineConfig(rows=8, tiering=tiering, kv_groups=2, world_size=2, num_gpu_blocks=32)
    with CPUEngine(cfg) as engine:
        engine.step()  # no request: the declared series reach the recorders' flush
        engine.refresh()
        recorders = [engine.connector.kvscope_recorder,
                     *(r.connector.kvscope_recorder for r in engine.ranks)]
        reg = CollectorRegistry(auto_describe=False)
        reg.register(RecorderCollector(recorders))
        ex = Exposition(generate_latest(reg).decode())
    tiered_only = {S.PROMOTIONS.name, S.CASCADES.name}
    for m in S.PRESET_VALUES:
        if m.name in tiered_only and not tiering:
            assert not ex.has(m.name), m.name  # no secondary tier: none at all
            continue
        assert ex.has(m.name), f"{m.name} not exported at the first step"
        assert not _missing(ex, m), (m.name, _missing(ex, m))
    # every KV group the engine has, and every rank (the in-process harness gives its ranks
    # their own rank label only where each has a shared-memory region: the tiering spec)
    assert {lb[S.L_KV_GROUP] for lb, _ in ex.series(S.LOOKUPS.name)} == {"0", "1"}
    if tiering:
        assert {lb[S.L_RANK] for lb, _ in ex.series(S.ROW_CHECKSUMS.name)} == {"0", "1"}
