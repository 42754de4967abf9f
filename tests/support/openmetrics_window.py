"""A recorded OpenMetrics file (``tests/fixtures/campaign*/*.om.gz``) as kv-diagnose's
RawWindow, without Prometheus: what a range query over [start, end] would give, sample
for sample (each series from its latest sample at or before ``start``, Prometheus'
lookback, to its last one before ``end``; ``instance`` is the target).

The recordings are OpenMetrics (seconds timestamps, ``# EOF``), read by prometheus_client's
OpenMetrics parser. Only the sample lines of the series kv-diagnose reads reach it, as in
``diagnostics/sources/scrape.py``: a recording is tens of thousands of lines, and its metadata names
``*_created`` families that clash with their counters' (the parser refuses the whole text)."""

from __future__ import annotations

import gzip
import re
from collections import defaultdict
from pathlib import Path

from prometheus_client.openmetrics.parser import text_string_to_metric_families

from kvscope.diagnostics.model import RawWindow, Series, SourceInfo
from kvscope.diagnostics.sources.wanted import WANTED_SERIES

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
LOOKBACK_S = 300.0  # Prometheus' default lookback delta


def read_samples(path: Path) -> dict[tuple[str, tuple], list[tuple[float, float]]]:
    """Every kv-diagnose series of the recording: (name, sorted labels) -> samples."""
    with gzip.open(path, "rt") as f:
        # comments (metadata, # EOF) and other series skipped unparsed
        wanted = [ln for ln in f if (m := _NAME.match(ln)) and m.group() in WANTED_SERIES]
    out: dict[tuple[str, tuple], list[tuple[float, float]]] = defaultdict(list)
    # without their metadata, each series parses as its own family of unknown type
    for family in text_string_to_metric_families("".join(wanted) + "# EOF\n"):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))].append((float(s.timestamp),
                                                                   float(s.value)))
    return out


def window(samples: dict[tuple[str, tuple], list[tuple[float, float]]], start: float,
           end: float, location: str) -> RawWindow:
    series = []
    for (name, labels), pts in sorted(samples.items()):
        before = [p for p in pts if start - LOOKBACK_S <= p[0] <= start]
        inside = [p for p in pts if start < p[0] <= end]
        kept = tuple(sorted(before[-1:] + inside))
        if kept:
            target = dict(labels).get("instance", "") or dict(labels).get("job", "")
            series.append(Series(name, labels, target, kept))
    src = SourceInfo(kind="prometheus", location=location, start=start, end=end, now=end,
                     lifetime=False, recent_span=min(300.0, (end - start) / 5))
    return RawWindow(src, tuple(series))
