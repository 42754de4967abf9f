"""A recorded OpenMetrics file (``benchmarks/results/campaign*/*.om.gz``) as kv-diagnose's
RawWindow, without Prometheus: what a range query over [start, end] would give, sample
for sample (each series from its latest sample at or before ``start``, Prometheus'
lookback, to its last one before ``end``; ``instance`` is the target)."""

from __future__ import annotations

import gzip
import re
from collections import defaultdict
from pathlib import Path

from kvscope.diagnostics.model import RawWindow, Series, SourceInfo
from kvscope.diagnostics.wanted import WANTED_SERIES

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+) (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
LOOKBACK_S = 300.0  # Prometheus' default lookback delta


def read_samples(path: Path) -> dict[tuple[str, tuple], list[tuple[float, float]]]:
    """Every kv-diagnose series of the recording: (name, sorted labels) -> samples."""
    out: dict[tuple[str, tuple], list[tuple[float, float]]] = defaultdict(list)
    with gzip.open(path, "rt") as f:
        for line in f:
            if line.startswith("#"):
                continue
            m = _LINE.match(line.rstrip("\n"))
            if m is None or m.group(1) not in WANTED_SERIES:
                continue
            labels = tuple(sorted((k, v.replace('\\"', '"').replace("\\\\", "\\"))
                                  for k, v in _LABEL.findall(m.group(2) or "")))
            out[(m.group(1), labels)].append((float(m.group(4)), float(m.group(3))))
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
