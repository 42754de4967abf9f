"""Prometheus export of a :class:`~kvscope.exporters.recorder.Recorder`.

Two paths (see docs/architecture.md):

* :class:`RecorderCollector` + :func:`start_exporter` - kvscope's standalone
  endpoint: one process (the scheduler, or one worker rank) serves its own
  ``/metrics`` on 127.0.0.1 by default. The collector snapshots the recorder per
  scrape; nothing is registered on prometheus-client's global registry unless
  the caller passes it.
* vLLM's own ``/metrics``: the connector hands :meth:`Recorder.take_delta` to
  vLLM's stats pipeline (``kvscope.connector``), which needs vLLM and so lives
  there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from kvscope.exporters import signals
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import Kind

DEFAULT_ADDR = "127.0.0.1"


class RecorderCollector:
    """A prometheus-client custom collector over one or more recorders.

    ``const_labels`` are added to every series (e.g. nothing for a scheduler,
    the process's own labels for a test harness running several ranks).
    """

    def __init__(self, recorders: Iterable[Recorder] | Recorder,
                 metrics: Iterable[signals.Metric] = signals.ALL_METRICS) -> None:
        self._recorders = [recorders] if isinstance(recorders, Recorder) else list(recorders)
        self._metrics = tuple(metrics)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families depend on what was recorded; skip collision checks

    def collect(self) -> Iterator[Metric]:
        snaps = [r.snapshot() for r in self._recorders]
        for m in self._metrics:
            if m.kind is Kind.COUNTER:
                fam = CounterMetricFamily(m.base, m.help, labels=m.labels)
                series = _merge_sum(s.counters for s in snaps)
                for (metric, labels), value in sorted(series.items(), key=_sort_key):
                    if metric is m:
                        fam.add_metric(list(labels), value)
            elif m.kind is Kind.GAUGE:
                fam = GaugeMetricFamily(m.name, m.help, labels=m.labels)
                series = {}
                for s in snaps:
                    series.update(s.gauges)
                for (metric, labels), value in sorted(series.items(), key=_sort_key):
                    if metric is m:
                        fam.add_metric(list(labels), value)
            else:
                fam = HistogramMetricFamily(m.name, m.help, labels=m.labels)
                merged: dict = {}  # one series per label set, summed over recorders
                for s in snaps:
                    for (metric, labels), h in s.histograms.items():
                        if metric is not m:
                            continue
                        acc = merged.get(labels)
                        if acc is None:
                            merged[labels] = [list(h.counts), h.total, h.buckets]
                        else:
                            acc[0] = [a + b for a, b in zip(acc[0], h.counts)]
                            acc[1] += h.total
                for labels, (counts, total, buckets) in sorted(merged.items()):
                    cumulative, running = [], 0
                    for upper, c in zip((*buckets, float("inf")), counts):
                        running += c
                        cumulative.append((_le(upper), running))
                    fam.add_metric(list(labels), cumulative, total)
            if fam.samples:
                yield fam


def _le(upper: float) -> str:
    return "+Inf" if upper == float("inf") else repr(float(upper))


def _sort_key(item):
    (metric, labels), _ = item
    return labels


def _merge_sum(dicts):
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


@dataclass
class Exporter:
    """A running standalone endpoint; :meth:`close` stops it."""

    server: WSGIServer
    thread: threading.Thread
    registry: CollectorRegistry
    addr: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_exporter(recorders: Iterable[Recorder] | Recorder, port: int = 0,
                   addr: str = DEFAULT_ADDR,
                   registry: CollectorRegistry | None = None) -> Exporter:
    """Serve ``recorders`` on ``http://addr:port/metrics`` (port 0: pick a free one)."""
    registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
    registry.register(RecorderCollector(recorders))
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return Exporter(server, thread, registry, addr, server.server_port)
