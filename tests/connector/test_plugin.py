"""kvscope's ``vllm.general_plugins`` entry point (connector/plugin.py) through vLLM's own
plugin loading: ``kv_connector="ObservedOffloadingConnector"`` with no module path.

vLLM loads general plugins once per process, so each case runs in a fresh interpreter
(the venv's installed entry points, vLLM's ``load_general_plugins``) and reports what it
saw as one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from kvscope.exporters import signals as S
from tests.connector.support import Exposition

pytestmark = pytest.mark.vllm

# Builds the connector class the way an engine does: vLLM's factory from a KVTransferConfig.
_BUILD = """
import json, sys
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

def build(module_path=None):
    try:
        return KVConnectorFactory.get_connector_class(KVTransferConfig(
            kv_connector="ObservedOffloadingConnector", kv_role="kv_both",
            kv_connector_module_path=module_path))
    except ValueError as e:
        return e

def kvscopes(cls):
    from kvscope.connector import ObservedOffloadingConnector
    return cls is ObservedOffloadingConnector

def report(**facts):
    print("FACTS " + json.dumps(facts))
"""


def _run(body: str, env: dict[str, str] | None = None, timeout: int = 300,
         prelude: str = _BUILD) -> tuple[dict, str]:
    code = prelude + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("FACTS ")]
    return json.loads(line[len("FACTS "):]), proc.stderr


def _without_filter() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_PLUGINS", None)
    return env


def test_the_venv_declares_the_entry_point():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "kvscope"]
    assert ep.value == "kvscope.connector.plugin:register"


def test_entry_point_load_imports_neither_vllm_nor_the_connector():
    """vLLM imports the entry point's module in every process it starts."""
    facts, _ = _run("""
        import json, sys
        from importlib.metadata import entry_points
        (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "kvscope"]
        func = ep.load()
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "torch"))
        print("FACTS " + json.dumps({"heavy": heavy, "func": func.__qualname__,
              "connector": "kvscope.connector.observed" in sys.modules}))
    """, prelude="")
    assert facts == {"heavy": [], "func": "register", "connector": False}


def test_vllm_loads_the_plugin_then_an_engine_restores_with_the_connector_named_alone():
    """vLLM's factory builds kvscope's class from the name; then the CPU harness (vLLM's
    real scheduler, the connector named only by name) stores a prompt, evicts it from the
    GPU prefix cache and restores it: judged by what the engine served, and kvscope's
    series must count the restored tokens."""
    facts, _ = _run("""
        before = build()
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        # registered lazily: the connector's module waits for the factory to build it
        lazy = "kvscope.connector.observed" not in sys.modules
        cls = build()

        from prometheus_client import CollectorRegistry, generate_latest
        from kvscope.exporters.prometheus import RecorderCollector
        from kvscope.sim.cpu_engine import CPUEngine, EngineConfig
        from kvscope.sim.cpu_model import prompt
        cfg = EngineConfig(rows=64, num_gpu_blocks=16, tiering=False, connector_by_name=True)
        with CPUEngine(cfg) as e:
            path = e.vllm_config.kv_transfer_config.kv_connector_module_path
            first = e.generate(prompt(3, 96), 2)
            for seed in (4, 5, 6):  # out of the GPU prefix cache, into the CPU tier
                e.generate(prompt(seed, 96), 2)
            e.drain()
            again = e.generate(prompt(3, 96), 2)
            e.drain()
            pending = e.scheduler.has_requests()
            reg = CollectorRegistry(auto_describe=False)
            reg.register(RecorderCollector([e.connector.kvscope_recorder]))
            text = generate_latest(reg).decode()
            engine_cls = type(e.connector)
        report(before=str(before), lazy=lazy, name=cls.__name__, kvscopes=kvscopes(cls),
               module_path=path, engine_kvscopes=kvscopes(engine_cls),
               restored=again.num_external_tokens, same=again.output == first.output,
               pending=pending, exposition=text)
    """, env=_without_filter())
    assert "Unsupported connector type" in facts["before"]  # not known before the plugins
    assert facts["lazy"] and facts["kvscopes"], facts
    assert facts["name"] == "ObservedOffloadingConnector"
    assert facts["module_path"] is None and facts["engine_kvscopes"]
    # the engine's truth: the whole prompt restored from the CPU tier, the same answer
    assert facts["restored"] == 96 and facts["same"] and not facts["pending"], facts
    ex = Exposition(facts["exposition"])
    assert ex.value(S.HIT_TOKENS.name) == facts["restored"]
    assert ex.value(S.LOOKUP_ROUNDS.name, verdict="hit") == 1


def test_excluded_by_vllm_plugins_it_is_not_loaded_and_vllm_is_unaffected():
    # another plugin of the group named: kvscope's is filtered out by vLLM
    facts, _ = _run("""
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        by_name = build()
        cls = build("kvscope.connector")
        report(loaded="kvscope.connector.plugin" in sys.modules, by_name=str(by_name),
               by_path=kvscopes(cls))
    """, env={"VLLM_PLUGINS": "lora_filesystem_resolver"})
    assert facts["loaded"] is False
    assert "Unsupported connector type" in facts["by_name"]
    assert facts["by_path"] is True  # the module path works as before


def test_loaded_twice_it_registers_once_and_raises_nothing():
    """vLLM guards a process's second ``load_general_plugins``; loading the group again
    (``load_plugins_by_group``, its own loader) and calling each plugin, as a second
    loader would, and a fresh copy of the module (its state lost, the factory's kept)
    must leave the registration as it was."""
    facts, stderr = _run("""
        import importlib
        from vllm.plugins import (DEFAULT_PLUGINS_GROUP, load_general_plugins,
                                  load_plugins_by_group)
        load_general_plugins()
        load_general_plugins()
        for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
            func()
        import kvscope.connector.plugin as plugin
        first = plugin.outcome()
        plugin = importlib.reload(plugin)
        plugin.register()
        plugin.register()
        report(first=first, again=plugin.outcome(), kvscopes=kvscopes(build()))
    """, env=_without_filter())
    assert facts == {"first": "registered", "again": "already registered", "kvscopes": True}
    assert "Traceback" not in stderr


def test_a_failed_registration_is_logged_once_and_vllm_starts():
    # the compat module made unimportable (None in sys.modules): register() cannot reach
    # vLLM's factory; vLLM's plugin loading must go on and the failure show once
    facts, stderr = _run("""
        sys.modules["kvscope.connector.compat.registry"] = None
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        import kvscope.connector.plugin as plugin
        plugin.register()
        report(outcome=plugin.outcome(), by_name=str(build()),
               by_path=kvscopes(build("kvscope.connector")))
    """, env=_without_filter())
    assert facts["outcome"] == "failed"
    assert "Unsupported connector type" in facts["by_name"]
    assert facts["by_path"] is True
    assert stderr.count("kvscope plugin: could not register") == 1, stderr[-4000:]
