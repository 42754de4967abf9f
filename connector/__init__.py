"""kvscope's instrumented vLLM connector (needs the ``vllm`` extra).

``kv_connector="ObservedOffloadingConnector"``, ``kv_connector_module_path="kvscope.connector"``.
vLLM is imported on first use of the connector class, so vLLM-free submodules
(``kvscope.connector.checksums``) stay importable without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ObservedOffloadingConnector", "Settings"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kvscope.connector import observed

        return getattr(observed, name)
    raise AttributeError(f"module 'kvscope.connector' has no attribute {name!r}")
