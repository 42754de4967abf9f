"""Check dashboard/rule PromQL against the signal contract and against a live Prometheus.

``unknown_names(expr)`` is pure (no Prometheus). ``check_live(prom, queries)`` runs each query
through the HTTP API and returns a list of problems: does not parse, names a kvscope metric
the contract does not have, or returns nothing although every series it selects exists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kvscope.dashboards.artifacts import Query
from kvscope.exporters import signals as s

# A metric name not glued to a colon or word char: recording-rule names such as
# "job_instance:kvscope_lookups:rate5m" contain kvscope_ but are not kvscope metrics.
KVSCOPE_NAME = re.compile(r"(?<![\w:])(kvscope_[A-Za-z0-9_]+)(?![\w:])")
VLLM_NAME = re.compile(r"(?<![\w:])(vllm:[A-Za-z0-9_:]+)")
RECORDED_NAME = re.compile(r"(?<![\w:\"])([a-z_]+:[A-Za-z0-9_]+:[A-Za-z0-9_]+)(?![\w:])")
SELECTOR = re.compile(
    r"(?<![\w:\"])((?:kvscope_|vllm:)[A-Za-z0-9_:]*|[a-z_]+:kvscope_[A-Za-z0-9_]+:[A-Za-z0-9_]+)"
    r"(\{[^}]*\})?"
)
_LABEL_NAMES = {v for k, v in vars(s).items() if k.startswith("L_")}

KNOWN_SERIES: frozenset[str] = frozenset(
    name for metric in s.ALL_METRICS for name in s.exposed_series(metric)
)
KNOWN_VLLM: frozenset[str] = frozenset(
    v for k, v in vars(s).items() if k.startswith("VLLM_") and isinstance(v, str) and ":" in v
)

# What Grafana would substitute; "All" for the template variables.
GRAFANA_VARS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
    "$model": ".*",
    "$engine": ".*",
    "$rank": ".*",
}


def substitute(expr: str) -> str:
    for var, value in sorted(GRAFANA_VARS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return expr


def kvscope_names(expr: str) -> set[str]:
    names = set(KVSCOPE_NAME.findall(expr)) - _LABEL_NAMES
    # label_values(metric, label) style second arguments are label names, not metrics
    return names


def unknown_names(expr: str) -> set[str]:
    """kvscope_* series the contract does not export, and vllm:* names not in signals.VLLM_*."""
    bad = {n for n in kvscope_names(expr) if n not in KNOWN_SERIES}
    bad |= {n for n in VLLM_NAME.findall(expr)
            if n not in KNOWN_VLLM and n.removesuffix("_bucket").removesuffix("_sum")
            .removesuffix("_count") not in KNOWN_VLLM}
    return bad


def selectors(expr: str) -> list[str]:
    """Vector selectors (name plus matchers, no range) of the kvscope/vLLM/recorded series."""
    return [name + (matchers or "") for name, matchers in SELECTOR.findall(expr)]


def check_live(prom, queries: Iterable[Query], *, expect_alerts: bool = False) -> list[str]:
    """Run every query on ``prom``; return problems (empty list: all good).

    A panel/record/variable query must return series when every selector in it matches series
    in Prometheus right now. Alert expressions must parse; they return data only when
    ``expect_alerts`` is set (callers pass the alerts their scenario should trigger).
    """
    from .prometheus import PromQLError

    problems: list[str] = []
    for q in queries:
        expr = substitute(q.expr)
        where = f"{q.source}: {q.kind} {q.name!r}"
        unknown = unknown_names(expr)
        if unknown:
            problems.append(f"{where}: names not in the signal contract: {sorted(unknown)}")
        if q.kind == "variable":
            m = re.match(r"label_values\((.+),\s*(\w+)\)$", expr)
            if not m:
                problems.append(f"{where}: unexpected variable query {expr!r}")
                continue
            expr = f"count by ({m.group(2)}) ({m.group(1)})"
        try:
            result = prom.query(expr)
        except PromQLError as err:
            problems.append(f"{where}: rejected by Prometheus: {err}")
            continue
        if q.kind == "alert" and not expect_alerts:
            continue
        missing = [sel for sel in selectors(expr) if not prom.query(f"count({sel})")]
        if not result and not missing:
            problems.append(f"{where}: no series although all its selectors match: {expr}")
    return problems
