"""Source (a): PromQL over a window through the Prometheus HTTP API.

Only ``/api/v1/query_range`` (and ``/api/v1/query`` to probe) is used, so it
works unchanged against Thanos and Mimir. Every series kv-diagnose needs is read
raw (no server-side aggregation): evidence building is the same code for every
source, and one query per metric name keeps a 24 h, 64-rank window small
(a few hundred points per series).
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from . import http
from .evidence import WANTED_SERIES
from .model import DiagnoseError, RawWindow, Series, SourceInfo

MAX_POINTS = 240  # per series over the window: enough for a timeline, cheap at 24 h
_SELECTOR = re.compile(r"^\{(.*)\}$", re.S)


def normalize_selector(selector: str) -> str:
    """'{model_name="x"}' or 'model_name="x"' -> 'model_name="x"' (the part inside braces)."""
    s = (selector or "").strip()
    if not s:
        return ""
    m = _SELECTOR.match(s)
    inner = m.group(1).strip() if m else s
    if "{" in inner or "}" in inner:
        raise DiagnoseError(f"--selector {selector!r}: expected label matchers like '{{model_name=\"x\"}}'")
    return inner


def query_for(name: str, selector: str) -> str:
    matchers = [f'__name__="{name}"'] + ([selector] if selector else [])
    return "{" + ",".join(matchers) + "}"


def escaped_name(name: str) -> str | None:
    """The name a Prometheus 2.x stores for ``name`` when it contains a colon.

    prometheus-client >= 0.22 answers an OpenMetrics scrape that does not ask
    for UTF-8 names (Prometheus 2.x) with ``escaping=underscores`` and, in
    0.26, escapes ':' to '_' in sample lines (client_python issue #1177):
    vLLM's ``vllm:num_requests_waiting`` lands as ``vllm_num_requests_waiting``.
    """
    return name.replace(":", "_") if ":" in name else None


def step_for(start: float, end: float) -> float:
    return float(max(1, math.ceil((end - start) / MAX_POINTS)))


class PrometheusClient:
    def __init__(self, url: str, timeout: float = 10.0):
        self.base = http.check_url(url, "Prometheus").rstrip("/")
        self.timeout = timeout

    def _api(self, path: str, params: dict) -> dict:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        body = http.get(url, self.timeout, "Prometheus")
        try:
            doc = json.loads(body)
        except ValueError:
            raise DiagnoseError(
                f"{self.base} does not look like a Prometheus API (no JSON from {path})"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error", "unknown error") if isinstance(doc, dict) else "unexpected reply"
            raise DiagnoseError(f"Prometheus rejected the query: {err}")
        return doc.get("data") or {}

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr, "timeout": f"{self.timeout:g}s"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._api("/api/v1/query", params).get("result", [])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        params = {
            "query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}",
            "timeout": f"{self.timeout:g}s",
        }
        data = self._api("/api/v1/query_range", params)
        if data.get("resultType") not in (None, "matrix"):
            raise DiagnoseError(f"{self.base}: unexpected result type {data.get('resultType')!r}")
        return data.get("result", [])


def prometheus_window(
    url: str,
    start: float,
    end: float,
    selector: str = "",
    timeout: float = 10.0,
    names: frozenset[str] = WANTED_SERIES,
) -> RawWindow:
    if end <= start:
        raise DiagnoseError(f"empty window: end ({end:.0f}) is not after start ({start:.0f})")
    sel = normalize_selector(selector)
    client = PrometheusClient(url, timeout)
    step = step_for(start, end)
    # Probe once: a wrong URL or a dead server fails here with one clear line.
    client.query("vector(1)", at=end)
    # (name as queried, name kv-diagnose knows it by)
    queries = [(n, n) for n in sorted(names)]
    queries += [(e, n) for n in sorted(names) if (e := escaped_name(n))]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(
            lambda q: client.query_range(query_for(q[0], sel), start, end, step), queries))
    series: list[Series] = []
    seen: set[tuple[str, tuple]] = set()
    for (queried, name), result in zip(queries, results, strict=True):
        for r in result:
            metric = dict(r.get("metric", {}))
            metric.pop("__name__", None)
            target = metric.get("instance", "") or metric.get("job", "")
            labels = tuple(sorted(metric.items()))
            if (name, labels) in seen:  # stored under both spellings: the real name wins
                continue
            seen.add((name, labels))
            try:
                samples = tuple((float(t), float(v)) for t, v in r.get("values", []))
            except (TypeError, ValueError):
                raise DiagnoseError(f"{url}: malformed sample values for {queried}") from None
            if samples:
                series.append(Series(name, labels, target, samples))
    src = SourceInfo(
        kind="prometheus",
        location=client.base,
        start=start,
        end=end,
        now=end,
        lifetime=False,
        recent_span=max(2 * step, min(300.0, (end - start) / 5)),
        selector=("{" + sel + "}") if sel else "",
    )
    return RawWindow(src, tuple(series))
