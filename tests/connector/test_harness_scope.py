"""A harness run leaves the process as it found it: the engines' hash seeds reach vLLM's
NONE_HASH without staying in os.environ, and the simulated world size is built into the
engine's own config (no frozen vLLM config written to afterwards)."""

from __future__ import annotations

import os

import pytest

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig
from kvscope.sim.scenarios import run_scenario

pytestmark = pytest.mark.vllm


def _none_hash() -> bytes:
    from vllm.v1.core import kv_cache_utils

    return bytes(kv_cache_utils.NONE_HASH)


def _seeded(seed: str) -> bytes:
    from vllm.utils.hashing import sha256

    return bytes(sha256(seed))


@pytest.fixture(scope="module", autouse=True)
def first_engine_imports():
    """vLLM imports some modules on its first engine only, and one of them edits the
    environment on import (cv2: LD_LIBRARY_PATH): not the harness's doing, so before."""
    with CPUEngine(EngineConfig(vllm_metrics=True)):
        pass


@pytest.mark.parametrize("process_seed", [None, "7"])
def test_a_run_leaves_the_environment_as_it_found_it(monkeypatch, process_seed):
    if process_seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", process_seed)
    before = dict(os.environ)
    # two engines sharing one disk tier, seeded "1" then "2": the restart restores nothing
    with run_scenario("stores-without-restores", vllm_metrics_port=0) as sc:
        during = dict(os.environ)
        restored = sc.facts["restored_tokens"]
        seeded_by_last_engine = _none_hash()
    with CPUEngine(EngineConfig(hash_seed=None)):  # the unseeded (random) path
        pass
    assert during == before
    assert dict(os.environ) == before
    # engine truth that each engine's own seed was the one vLLM hashed with
    assert seeded_by_last_engine == _seeded("2")
    assert restored == 0


def test_an_engine_seed_is_its_own_not_the_process_one(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    with CPUEngine(EngineConfig(hash_seed="1")):
        assert _none_hash() == _seeded("1")
        assert os.environ["PYTHONHASHSEED"] == "7"


def test_the_simulated_world_size_is_built_into_the_config():
    from vllm.config import ParallelConfig

    with CPUEngine(EngineConfig(world_size=2)) as e:
        parallel = e.vllm_config.parallel_config
        assert (parallel.tensor_parallel_size, parallel.world_size) == (2, 2)
        assert len(e.ranks) == 2
    assert ParallelConfig().world_size == 1


def test_the_harness_writes_no_frozen_vllm_object():
    """``object.__setattr__`` is how a frozen (vLLM config) dataclass gets written to."""
    import ast
    from pathlib import Path

    import kvscope.sim

    found = [f"{path.name}:{node.lineno}"
             for path in sorted(Path(kvscope.sim.__file__).parent.glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "__setattr__"]
    assert found == []
