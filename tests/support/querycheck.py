"""Check dashboard/rule PromQL against the signal contract and against a live Prometheus.

``unknown_names(expr)`` is pure (no Prometheus). ``check_live(prom, queries)`` runs each query
through the HTTP API and returns a list of problems: does not parse, names a kvscope metric
the contract does not have, or returns nothing although every series it selects exists.

``scope(expr, 'instance="..."')`` narrows every series selector of a query to one target, so
that one Prometheus scraping several engines can check each engine's view on its own, and
``substitute(expr, model=...)`` plays a Grafana template variable selection.
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
# `up` (Prometheus' own series) as a selector, not as part of a word or a label value
UP_SELECTOR = re.compile(r"(?<![\w:\"])(up)(\{[^}]*\})?(?![\w:(])")
# kvscope label names that look like metric names (kvscope_version in `by (...)`)
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


def substitute(expr: str, **selected: str) -> str:
    """Replace Grafana's variables; ``selected`` picks template variables (``model=...``)
    instead of "All". Values are used as Grafana sends a multi-value selection: regex-escaped.
    """
    values = dict(GRAFANA_VARS)
    for name, value in selected.items():
        values[f"${name}"] = regex_escape(value)
    for var, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return expr


def regex_escape(value: str) -> str:
    """Escape RE2 metacharacters; backslashes doubled again for the PromQL string literal."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", value)


def _with_matcher(name: str, matchers: str | None, extra: str) -> str:
    inner = (matchers or "{}")[1:-1].strip()
    return name + "{" + extra + ("," + inner if inner else "") + "}"


def scope(expr: str, extra: str) -> str:
    """Add the matchers ``extra`` (``'instance="127.0.0.1:9400"'``) to every series selector
    of ``expr``: kvscope_* and vllm:* series, recorded series and ``up``."""
    def sub(m: re.Match) -> str:
        name, matchers = m.group(1), m.group(2)
        if name in _LABEL_NAMES:
            return m.group(0)
        return _with_matcher(name, matchers, extra)

    expr = SELECTOR.sub(sub, expr)
    return UP_SELECTOR.sub(lambda m: _with_matcher(m.group(1), m.group(2), extra), expr)


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
    return [name + (matchers or "") for name, matchers in SELECTOR.findall(expr)
            if name not in _LABEL_NAMES]


def check_live(prom, queries: Iterable[Query], *, expect_alerts: bool = False,
               within: str = "", **selected: str) -> list[str]:
    """Run every query on ``prom``; return problems (empty list: all good).

    A panel/record/variable query must return series when every selector in it matches series
    in Prometheus right now. Alert expressions must parse; they return data only when
    ``expect_alerts`` is set (callers pass the alerts their scenario should trigger).
    ``within`` (matchers, e.g. ``'instance="127.0.0.1:9400"'``) narrows every query to one
    target first (see ``scope``); ``selected`` sets template variables (``model="llama"``).
    """
    from .prometheus import PromQLError

    problems: list[str] = []
    for q in queries:
        expr = substitute(q.expr, **selected)
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
        if within:
            expr = scope(expr, within)
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


def alerts_with_data(prom, queries: Iterable[Query], within: str = "") -> set[str]:
    """Names of the alert rules whose expression selects something now (``for:`` aside)."""
    out = set()
    for q in queries:
        if q.kind != "alert":
            continue
        expr = substitute(q.expr)
        if prom.query(scope(expr, within) if within else expr):
            out.add(q.name)
    return out
