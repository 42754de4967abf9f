"""Naming a connector class to vLLM's connector factory (the plugin's one vLLM call).

``KVConnectorFactory.register_connector(name, module_path, class_name)`` is vLLM's public
registration API, the same in 0.26 and 0.33: it stores a lazy loader (the class's module
is imported when an engine builds the connector, not here) and raises ``ValueError`` when
the name is taken, which is its only way to say so.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory


def register_connector(name: str, module_path: str, class_name: str) -> bool:
    """Register ``name``; False when the factory already had it (registered before)."""
    try:
        KVConnectorFactory.register_connector(name, module_path, class_name)
    except ValueError:
        return False
    return True
