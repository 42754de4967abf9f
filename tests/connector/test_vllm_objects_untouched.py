"""kvscope leaves vLLM's offloading objects as fast as it found them, on vLLM's real scheduler.

From CPython 3.11 on an object's attributes live inline until something asks for its
``__dict__`` (``vars(obj)``, ``obj.__dict__``): then a dict is built and every attribute read
of the object takes a slower path for the rest of its life. kvscope once read
``vars()`` of vLLM's tiering manager, tiers and cache policy to check their ``lookup`` was
vLLM's own, and vLLM's prefix scan ran ~15 % slower on the same keys in every observed
process (docs/measured-facts.md: ``vllm_scan_alone_ms``). An object whose dict was
built holds it among its referents (``gc.get_referents``, which builds nothing); the control
builds one to show the check sees it.
"""

from __future__ import annotations

import gc

import pytest

from kvscope.sim.cpu_engine import CPUEngine, EngineConfig, prompt

pytestmark = pytest.mark.vllm


def _dict_built(obj) -> bool:
    """Whether ``obj``'s ``__dict__`` exists as a dict (a referent holding its attributes)."""
    names = [n for n in ("manager", "primary_tier", "_policy", "blocks", "chunks",
                         "_lookup_manager", "_lookup_state", "secondary_tiers", "config")
             if hasattr(obj, n)]
    assert names, type(obj)
    return any(type(r) is dict and any(n in r for n in names) for r in gc.get_referents(obj))


def _vllm_objects(e: CPUEngine) -> dict[str, object]:
    cs = e.connector.connector_scheduler
    manager = getattr(cs.manager, "_inner", cs.manager)  # vLLM's, under kvscope's proxy
    out = {"connector scheduler": cs, "manager": manager}
    primary = getattr(manager, "primary_tier", manager)  # the CPU tier alone: the manager
    out["primary tier"], out["cache policy"] = primary, primary._policy
    for i, tier in enumerate(getattr(manager, "secondary_tiers", ())):
        out[f"tier {i}"], out[f"tier {i}'s lookups"] = tier, tier._lookup_manager
    return out


@pytest.mark.parametrize("tiering", [True, False], ids=["tiering", "cpu tier"])
def test_kvscope_builds_no_dict_of_vllms_objects(tiering):
    from kvscope.connector.compat.prefix_scan import scan_read_on_this_release

    with CPUEngine(EngineConfig(rows=64, tiering=tiering)) as e:
        # the taps that read them, on the releases whose scan was read (else the per-key tap)
        assert e.connector._kvscope_observer.lookups_from_scan == \
            scan_read_on_this_release(tiering)
        p = prompt(1, 512)
        e.generate(p, 2)
        e.drain()
        e.generate(p, 2)  # a re-ask: looked up, loaded
        e.drain()
        objects = _vllm_objects(e)
        assert len(objects) == (6 if tiering else 4)
        assert {name for name, obj in objects.items() if _dict_built(obj)} == set()
        vars(objects["cache policy"])  # the control: what the check must see
        assert _dict_built(objects["cache policy"])


def test_the_benchmarks_switch_builds_no_dict_of_vllms_objects():
    """The within-process A/B's switch (kvscope.sim.kvscope_switch) turns kvscope off and on
    again without building the dict of any of vLLM's objects: a dict built there would slow
    vLLM's scan in both of its arms, so stock would be measured slower than it runs."""
    from kvscope.sim.kvscope_switch import KvscopeSwitch

    with CPUEngine(EngineConfig(rows=64, tiering=True)) as e:
        p = prompt(1, 512)
        e.generate(p, 2)
        e.drain()
        switch = KvscopeSwitch(e.scheduler, [r.connector for r in e.ranks])
        for on in (False, True, False):
            switch.set(on)
            e.generate(p, 2)  # a re-ask in each state: looked up, loaded
            e.drain()
        objects = _vllm_objects(e)
        assert {name for name, obj in objects.items() if _dict_built(obj)} == set()
