"""Which series kv-diagnose reads (the only ones a bundle keeps), and which are counters.

Metric names come from :mod:`kvscope.exporters.signals` and nowhere else.
"""

from __future__ import annotations

from kvscope.exporters import signals as S

VLLM_GAUGES = (
    S.VLLM_REQUESTS_RUNNING,
    S.VLLM_REQUESTS_WAITING,
    S.VLLM_REQUESTS_WAITING_BY_REASON,
    S.VLLM_KV_FETCH_BY_STAGE,
    S.VLLM_TIERING_DEFERRED_RELEASE_CHUNKS,
)
VLLM_COUNTERS = (
    S.VLLM_EXTERNAL_PREFIX_QUERIES,
    S.VLLM_EXTERNAL_PREFIX_HITS,
    S.VLLM_OFFLOAD_LOAD_BYTES,
    S.VLLM_OFFLOAD_STORE_BYTES,
    S.VLLM_REQUEST_QUEUE_TIME + "_sum",
    S.VLLM_REQUEST_QUEUE_TIME + "_count",
)
# Histograms: _sum/_count are read, and the buckets of those kv-diagnose plan reads (no
# verdict needs a bucket).
BUCKETS_READ = (S.CEILING_CONCURRENT_REQUESTS,)
KVSCOPE_SERIES = tuple(
    name
    for m in S.ALL_METRICS
    for name in (
        (m.name + "_sum", m.name + "_count") if m.kind is S.Kind.HISTOGRAM else (m.name,)
    )
) + tuple(m.name + "_bucket" for m in BUCKETS_READ)
WANTED_SERIES: frozenset[str] = frozenset(KVSCOPE_SERIES + VLLM_GAUGES + VLLM_COUNTERS
                                          + S.VLLM_NATIVE_OFFLOAD_SERIES)  # native.py
COUNTER_SERIES: frozenset[str] = frozenset(
    [m.name for m in S.ALL_METRICS if m.kind is S.Kind.COUNTER]
    + [n for n in KVSCOPE_SERIES if n.endswith(("_sum", "_count", "_bucket"))]
    + list(VLLM_COUNTERS)
)


def is_counter(name: str) -> bool:
    return name in COUNTER_SERIES
