"""A stand-in kvscope exporter: every metric of ``signals.ALL_METRICS`` with plausible values.

Not the real exporter (that is ``kvscope.exporters``); it exists so the dashboard/rule query
checks can run against a live Prometheus without vLLM. Every labelled metric gets one child per
value of its closed label sets (``Metric.label_values``); counters and histograms advance on a
background ticker so ``rate()`` has something to show, and the step timestamps stay fresh.

    with fake_exporter() as url:     # "http://127.0.0.1:<port>/metrics"
        ...
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from kvscope.exporters import signals as s

from .prometheus import HOST, free_port

# Values for labels whose set is not closed in the contract.
_OPEN_LABEL_VALUES: dict[str, tuple[str, ...]] = {
    s.L_KV_GROUP: ("0", "1"),
    s.L_RANK: ("0", "1", s.RANK_MANAGER),
    s.L_KIND: ("full_attention",),  # kvscope_kv_group_info's attention kind
    s.L_TOKENS_PER_BLOCK: ("16",),
    s.L_KVSCOPE_VERSION: ("0.1.0",),
    s.L_VLLM_VERSION: ("0.26.0",),
    s.L_SPEC: ("CPUOffloadingSpec",),
    s.L_TIERS: ("cpu,fs",),
    s.L_PRIMARY_ROWS: ("64",),
    s.L_HASH_SEED: ("0",),
    s.L_CHECKSUM_POLICY: ("refuse",),
    s.L_CHUNK_TOKENS: ("16",),
    s.L_MAX_BATCHED_TOKENS: ("2048",),
    s.L_WORLD_SIZE: ("2",),  # ranks "0" and "1" above
}

# Gauge values that make the dashboards look like a busy, healthy engine.
_GAUGES: dict[str, float] = {
    s.PRIMARY_ROWS.name: 64.0,
    s.LAST_ROUND_PENDING_KEYS.name: 12.0,
    s.LAST_ROUND_REQUEST_KEYS.name: 24.0,
    s.PRIMARY_ROW_BYTES.name: 16384.0,
    s.PENDING_TRANSFERS.name: 1.0,
    s.OLDEST_PENDING_TRANSFER.name: 0.02,
    s.REQUESTS.name: 2.0,
    s.REQUESTS_IN_FLIGHT.name: 8.0,
    s.TRANSFERS_IN_FLIGHT.name: 1.0,
    s.INFO.name: 1.0,
    s.KV_GROUP_INFO.name: 1.0,
    s.GPU_BLOCKS.name: 512.0,  # total and in use alike; nothing held at idle (0)
    s.HOST_MEMORY_AVAILABLE.name: 64e9,
    s.PROCESS_RESIDENT_MEMORY.name: 6e9,
}
_TIMESTAMPS = (s.LAST_STEP_TIMESTAMP.name, s.WORKER_LAST_STEP_TIMESTAMP.name)


def _label_sets(metric: s.Metric) -> list[tuple[str, ...]]:
    pools = [metric.label_values.get(label) or _OPEN_LABEL_VALUES.get(label, ("x",))
             for label in metric.labels]
    return list(itertools.product(*pools)) if metric.labels else [()]


def build_registry() -> tuple[CollectorRegistry, callable]:
    """A registry holding every contract metric, and a ``tick()`` that advances it."""
    registry = CollectorRegistry()
    children: list[tuple[s.Metric, object]] = []
    for metric in s.ALL_METRICS:
        if metric.kind is s.Kind.COUNTER:
            family = Counter(metric.base, metric.help, metric.labels, registry=registry)
        elif metric.kind is s.Kind.GAUGE:
            family = Gauge(metric.name, metric.help, metric.labels, registry=registry)
        else:
            family = Histogram(metric.name, metric.help, metric.labels, registry=registry,
                               buckets=metric.buckets or Histogram.DEFAULT_BUCKETS)
        for values in _label_sets(metric):
            child = family.labels(*values) if values else family
            children.append((metric, child))
            if metric.kind is s.Kind.GAUGE and metric.name in _GAUGES:
                child.set(_GAUGES[metric.name])

    def tick() -> None:
        now = time.time()
        for metric, child in children:
            if metric.kind is s.Kind.COUNTER:
                child.inc(3)
            elif metric.kind is s.Kind.HISTOGRAM:
                child.observe(0.004 if metric is s.TRANSFER_SECONDS else 8)
            elif metric.name in _TIMESTAMPS:
                child.set(now)

    tick()
    return registry, tick


@contextmanager
def fake_exporter(tick_interval: float = 0.25, port: int | None = None) -> Iterator[str]:
    """Serve the stand-in registry on 127.0.0.1:<port or a free one>; yield its /metrics URL."""
    registry, tick = build_registry()
    port = port or free_port()
    server, thread = start_http_server(port, addr=HOST, registry=registry)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(tick_interval):
            tick()

    ticker = threading.Thread(target=loop, name="fake-exporter-ticker", daemon=True)
    ticker.start()
    try:
        yield f"http://{HOST}:{port}/metrics"
    finally:
        stop.set()
        ticker.join(timeout=5)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
