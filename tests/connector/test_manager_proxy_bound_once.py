"""kvscope's manager proxy keeps what vLLM's offloading manager binds once and reads every
step (``compat.bound_once``): the same objects as the manager's, read without a
``__getattr__`` frame; an attribute answered anew at each read is left to be read so, and
one set through the proxy is the manager's new value from then on. On vLLM's real managers
(the CPU harness's tiering and CPU-only engines)."""

from __future__ import annotations

import pytest

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

pytestmark = pytest.mark.vllm


def _proxy(e: CPUEngine):
    proxy = e.connector.connector_scheduler.manager
    return proxy, object.__getattribute__(proxy, "_inner")


def test_the_tiering_managers_tiers_and_lock_are_kept_as_the_manager_has_them():
    with CPUEngine(EngineConfig(rows=16, tiering=True)) as e:
        proxy, inner = _proxy(e)
        kept = object.__getattribute__(proxy, "__dict__")
        assert kept["secondary_tiers"] is inner.secondary_tiers
        assert len(inner.secondary_tiers) == 1  # the fs tier
        if hasattr(inner, "lock"):  # vLLM 0.33+: a property over the lock made in __init__
            assert kept["lock"] is inner.lock
        else:  # vLLM 0.26 has none
            assert "lock" not in kept
        # the engine serves through it: a prompt asked again reuses its cached prefix
        from kvscope.sim.cpu_engine import prompt

        p = prompt(7, 64)
        e.generate(p, 2)
        e.drain()
        assert e.generate(p, 2).num_cached_tokens > 0


def test_an_attribute_answered_anew_at_each_read_is_not_kept():
    with CPUEngine(EngineConfig(rows=16, tiering=False)) as e:
        proxy, inner = _proxy(e)
        kept = object.__getattribute__(proxy, "__dict__")
        assert "lock" not in kept  # 0.33+: the CPU manager's lock is a nullcontext per read
        if hasattr(inner, "lock"):
            with proxy.lock:  # read through to the manager, as vLLM reads it
                pass


def test_a_value_set_through_the_proxy_replaces_the_kept_one():
    with CPUEngine(EngineConfig(rows=16, tiering=True)) as e:
        proxy, inner = _proxy(e)
        tiers = inner.secondary_tiers
        try:
            proxy.secondary_tiers = replaced = list(tiers)
            assert inner.secondary_tiers is replaced and proxy.secondary_tiers is replaced
        finally:
            proxy.secondary_tiers = tiers
        assert proxy.secondary_tiers is tiers
