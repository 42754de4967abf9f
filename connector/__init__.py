"""kvscope's instrumented vLLM connector (needs the ``vllm`` extra).

``kv_connector="ObservedOffloadingConnector"``, ``kv_connector_module_path="kvscope.connector"``.
"""

from kvscope.connector.observed import ObservedOffloadingConnector, Settings

__all__ = ["ObservedOffloadingConnector", "Settings"]
