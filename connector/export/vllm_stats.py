"""kvscope's series on vLLM's stats pipeline (export path 1): vLLM's /metrics.

Its own room: the stats object built from a recorder delta (``stats_from_delta``) and
vLLM's offload Prometheus metrics with every kvscope signal declared on them
(``KvscopePromMetrics``, built by vLLM through the connector's ``build_prom_metrics``).
"""

from __future__ import annotations

import logging

from kvscope.connector.compat.vllm_api import (
    OffloadingConnectorStats,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
    OffloadPromMetrics,
    declare_offload_metric,
    observe_histogram_values,
)
from kvscope.exporters import signals
from kvscope.exporters.signals import Kind

logger = logging.getLogger("kvscope")


def stats_from_delta(delta) -> OffloadingConnectorStats | None:
    """vLLM's stats object for a recorder delta (None when empty); on the scheduler side
    built by kvscope's aggregator thread, handed over whole by the scheduler thread."""
    if delta.is_empty():
        return None
    ours = OffloadingConnectorStats()
    # bound once: on the scheduler side this runs at every flush (the aggregator's cadence)
    inc, set_gauge = ours.increase_counter, ours.set_gauge
    for (metric, labels), value in delta.counters.items():
        inc(metric.name, value, labels)
    for (metric, labels), value in delta.gauges.items():
        set_gauge(metric.name, value, labels)
    for (metric, labels), values in delta.observations.items():
        if values:  # one list per label values, not a call per observation
            observe_histogram_values(ours, metric.name, labels, values)
    return ours


def _metadata(m: signals.Metric):
    if m.kind is Kind.COUNTER:
        return OffloadingCounterMetadata(documentation=m.help, labelnames=m.labels)
    if m.kind is Kind.GAUGE:
        return OffloadingGaugeMetadata(documentation=m.help, labelnames=m.labels)
    return OffloadingHistogramMetadata(documentation=m.help, labelnames=m.labels,
                                       buckets=m.buckets)


class KvscopePromMetrics(OffloadPromMetrics):
    """vLLM's offload Prometheus metrics plus every kvscope signal.

    vLLM asserts that each stats key it observes was declared, so the kvscope
    names are declared here, keyed by their exposed name and created with the
    name prometheus-client expects (counters without ``_total``).
    """

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._kvscope_names: set[str] = set()
        for m in signals.ALL_METRICS:
            try:
                self._declare(m)
            except Exception as exc:  # a metric we cannot declare is dropped, not fatal
                logger.warning("kvscope: cannot register %s on vLLM's registry: %r", m.name, exc)

    def _declare(self, m: signals.Metric) -> None:
        declare_offload_metric(self, m.name, m.base, _metadata(m))
        self._kvscope_names.add(m.name)

    def observe(self, transfer_stats_data, engine_idx: int = 0):
        data = transfer_stats_data.get("data", {})
        prefix = signals.PREFIX
        for key in data:
            if key.startswith(prefix):
                break
        else:  # no kvscope series in this batch (most steps): vLLM's, untouched
            return super().observe(transfer_stats_data, engine_idx)
        types = transfer_stats_data.get("types", {})
        theirs = {k: v for k, v in data.items() if not k.startswith(signals.PREFIX)}
        ours = {k: v for k, v in data.items() if k in self._kvscope_names}
        # vLLM's own keys beside types/data (0.33's "info": vllm:kv_offload_config_info) pass
        # through untouched; only kvscope's series are split off
        super().observe({**transfer_stats_data, "types": types, "data": theirs}, engine_idx)
        if ours:
            try:
                super().observe({"types": types, "data": ours}, engine_idx)
            except Exception as exc:
                logger.warning("kvscope: dropped a stats batch on vLLM's /metrics: %r", exc)
