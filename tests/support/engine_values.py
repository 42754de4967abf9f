"""How VictoriaMetrics' answers differ from Prometheus' for every query kvscope ships.

Both engines replay the recorded fault campaigns (``campaign_replay.replayed`` and
``campaign_replay_vm.replayed_vm``); every panel, recording rule, variable and alert expression
(``CAMPAIGN_CONFIG``) is asked over the whole campaign at a 5 s step, on a grid both engines
keep (VictoriaMetrics aligns a range query's start to its step). Per query, one JSON line:

* ``series``: label sets on Prometheus / on VictoriaMetrics, and whether they are the same;
* ``only_prometheus``: points Prometheus has and VictoriaMetrics not, split into ``nan``
  (VictoriaMetrics leaves NaN out of its answers: 0/0 ratios, quantiles of no observation),
  ``lookback``
  (VictoriaMetrics has the series within the 5 min before: Prometheus' lookback still shows
  the last sample, VictoriaMetrics' staleness has ended the series) and ``other``;
* ``only_vm``: points VictoriaMetrics has and Prometheus not, split into ``edge`` (within a
  rate window of a Prometheus point: MetricsQL's rate() also uses the sample before its
  window, so it answers one or two steps earlier and later) and ``other``;
* ``common``: points on both; ``max_rel``: the largest relative difference among them;
  ``zero_vs_nonzero``: points where exactly one engine says 0.

    python -m tests.support.engine_values > query_values.jsonl   # the benchmarks' results/victoriametrics/
"""

from __future__ import annotations

import json
import math
import re
import sys

from kvscope.dashboards.artifacts import queries
from tests.support import campaign_replay as replay
from tests.support import campaign_replay_vm as replay_vm
from tests.support import querycheck as qc

STEP = 5
LOOKBACK_S = 300  # Prometheus' default lookback delta
EDGE_S = 20  # CAMPAIGN_CONFIG.rate_window


def _points(engine, expr: str, start: float, end: float) -> dict[tuple, dict[float, float]]:
    return {tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__")):
            {float(t): float(v) for t, v in s["values"]}
            for s in engine.query_range(expr, start, end, STEP)}


def compare(a: dict[tuple, dict[float, float]], b: dict[tuple, dict[float, float]]) -> dict:
    out = {"series": [len(a), len(b), set(a) == set(b)], "common": 0, "max_rel": 0.0,
           "zero_vs_nonzero": 0, "only_prometheus": {"nan": 0, "lookback": 0, "other": 0},
           "only_vm": {"edge": 0, "other": 0}}
    for key in set(a) & set(b):
        pa, pb = a[key], b[key]
        for t in set(pa) - set(pb):
            if math.isnan(pa[t]):
                out["only_prometheus"]["nan"] += 1
            elif any(t - LOOKBACK_S <= u < t for u in pb):
                out["only_prometheus"]["lookback"] += 1
            else:
                out["only_prometheus"]["other"] += 1
        for t in set(pb) - set(pa):
            edge = any(abs(t - u) <= EDGE_S for u in pa)
            out["only_vm"]["edge" if edge else "other"] += 1
        for t in set(pa) & set(pb):
            x, y = pa[t], pb[t]
            out["common"] += 1
            if (x == 0) != (y == 0):
                out["zero_vs_nonzero"] += 1
            if x != y and not (math.isnan(x) and math.isnan(y)):
                out["max_rel"] = max(out["max_rel"], abs(x - y) / max(abs(x), abs(y)))
    out["max_rel"] = round(out["max_rel"], 4)
    return out


def main() -> int:
    start, end = replay.span()
    start, end = math.floor(start / STEP) * STEP, math.ceil(end / STEP) * STEP
    with replay.replayed() as prom, replay_vm.replayed_vm() as vm:
        for q in queries(replay.CAMPAIGN_CONFIG):
            expr = qc.substitute(q.expr)
            if q.kind == "variable":
                metric, label = re.match(r"label_values\((.+),\s*(\w+)\)$", expr).groups()
                expr = f"count by ({label}) ({metric})"
            row = {"kind": q.kind, "name": q.name, "source": q.source,
                   "reads_a_rate": bool(re.search(r"\b(rate|increase|irate)\(|:\w*rate", expr))}
            row.update(compare(_points(prom, expr, start, end), _points(vm, expr, start, end)))
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
