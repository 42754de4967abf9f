"""kvscope's instrumented vLLM connector (needs the ``vllm`` extra).

``kv_connector="ObservedOffloadingConnector"``, ``kv_connector_module_path="kvscope.connector"``
(the module path may be left out: kvscope's vLLM plugin, :mod:`kvscope.connector.plugin`,
registers the name).
vLLM is imported on first use of the connector class, so vLLM-free submodules
(``kvscope.connector.integrity.checksums``) stay importable without it.
"""

from __future__ import annotations

from typing import Any

# Each public name's module, imported on first use.
_HOMES = {"ObservedOffloadingConnector": "observed", "Settings": "settings"}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"kvscope.connector.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'kvscope.connector' has no attribute {name!r}")
