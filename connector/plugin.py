"""vLLM general plugin: ``kv_connector="ObservedOffloadingConnector"`` without a module path.

The ``vllm.general_plugins`` entry point ``kvscope`` (pyproject.toml) points at
:func:`register`. vLLM imports this module and calls it in every process it starts (API
server, engine core, workers), once per process (``load_general_plugins``), but nothing
stops a second call, so it is idempotent. Importing this module imports neither vLLM nor
the connector; :func:`register` imports vLLM's connector factory only (the connector's
module is imported by the factory when an engine builds it). A failure must never stop
vLLM from starting: it is logged once and swallowed; ``kv_connector_module_path=
"kvscope.connector"`` keeps working without the plugin.
"""

from __future__ import annotations

import logging

CONNECTOR_NAME = "ObservedOffloadingConnector"
CONNECTOR_MODULE = "kvscope.connector"

logger = logging.getLogger(__name__)

# Set after the first call, whatever its outcome: later calls do nothing (and log nothing).
_outcome: str | None = None


def register() -> None:
    """Name kvscope's connector to vLLM's factory; never raises."""
    global _outcome
    if _outcome is not None:
        return
    try:
        from kvscope.connector.compat.registry import register_connector

        new = register_connector(CONNECTOR_NAME, CONNECTOR_MODULE, CONNECTOR_NAME)
        _outcome = "registered" if new else "already registered"
        if not new:  # another copy of kvscope, or another package, took the name first
            logger.info("kvscope plugin: connector %s was already registered with vLLM; "
                        "left as it was", CONNECTOR_NAME)
    except Exception:
        _outcome = "failed"
        logger.warning("kvscope plugin: could not register connector %s with vLLM "
                       "(use kv_connector_module_path=%r instead)",
                       CONNECTOR_NAME, CONNECTOR_MODULE, exc_info=True)


def outcome() -> str | None:
    """What the first call did in this process (None: not called yet)."""
    return _outcome
