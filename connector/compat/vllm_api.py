"""The vLLM names and private hooks the connector itself uses, in one place.

Public classes are re-exported (the connector subclasses and builds them); every
private vLLM attribute the connector needs is behind a named function here, so a
vLLM release that moves one changes this module only.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
    OffloadPromMetrics,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
    TransferResult,
)

__all__ = [
    "KVConnectorRole", "OffloadingConnector", "OffloadingConnectorStats", "OffloadPromMetrics",
    "OffloadingCounterMetadata", "OffloadingGaugeMetadata", "OffloadingHistogramMetadata",
    "TransferResult", "bound_load_jobs", "none_hash", "declare_offload_metric",
    "observe_histogram_values",
]


def bound_load_jobs(connector: Any) -> Any:
    """The load jobs of the connector metadata bound for this step (worker role)."""
    return getattr(getattr(connector, "_connector_metadata", None), "load_jobs", None)


def observe_histogram_values(stats: Any, name: str, labels: tuple, values: list) -> None:
    """``stats.observe_histogram(name, v, labels)`` for every v of a non-empty list, the
    first through that method (the metric's type and maps, as vLLM sets them), the rest as
    one extend of the list it appended to: vLLM's OffloadingConnectorStats payload (0.26,
    0.33; documented on the class) keeps a histogram's observations per label values as
    one list, ``data["data"][name][labels]``. A worker rank hands over one duration per
    transfer (~1,500 per GPU iteration): a Python call each was most of the stats build."""
    stats.observe_histogram(name, values[0], labels)
    if len(values) > 1:
        stats.data["data"][name][labels].extend(values[1:])


_kv_cache_utils: Any = None  # vllm.v1.core.kv_cache_utils, once imported


def none_hash() -> object:
    """vLLM's NONE_HASH (re-seeded when the prefix-hash configuration changes). Read at
    every gauge refresh: the module is kept after the first call (an import statement
    runs Python-level import machinery each time, ~10 us on a cold cache)."""
    global _kv_cache_utils
    if _kv_cache_utils is None:
        from vllm.v1.core import kv_cache_utils

        _kv_cache_utils = kv_cache_utils
    return getattr(_kv_cache_utils, "NONE_HASH", None)


def declare_offload_metric(prom_metrics: Any, name: str, base: str, metadata: Any) -> None:
    """Create a metric on vLLM's offload Prometheus metrics and register it under ``name``.

    vLLM (``OffloadPromMetrics._create_metric`` and its ``_offloading_metric_*``
    tables) asserts that each stats key it observes was declared. vLLM re-creates
    its stat logger in one process (tests, restarts of the logger) and unregisters
    only "vllm:" collectors: a stale kvscope collector of the same name is dropped
    from prometheus-client's default registry and the creation tried once more.
    """
    try:
        metric = prom_metrics._create_metric(base, metadata)
    except ValueError:
        from prometheus_client import REGISTRY

        for collector, names in list(REGISTRY._collector_to_names.items()):
            if base in names or name in names:
                REGISTRY.unregister(collector)
        metric = prom_metrics._create_metric(base, metadata)
    prom_metrics._offloading_metric_metadata[name] = metadata
    prom_metrics._offloading_metric_defs[name] = metric
