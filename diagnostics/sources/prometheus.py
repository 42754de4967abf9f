"""Source (a): PromQL over a window through the Prometheus HTTP API.

Only ``/api/v1/query_range``, ``/api/v1/query`` and (long windows)
``/api/v1/label/__name__/values`` are used, so it works unchanged against Thanos and
Mimir. A window of up to four hours is read raw, one query per metric name, at most
:data:`MAX_POINTS` points per series. A longer one is summarised server-side so that no
peak, dip or reset hides between points and Prometheus does not decode every rank's
history (:mod:`.prometheus_long`). Either way evidence building is the same code for
every source.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
import urllib.parse

from ..model import DiagnoseError, RawWindow, Series, SourceInfo
from . import http
from . import prometheus_long as long_window
from .limits import (
    DEFAULT_TIMEOUT_S,
    MAX_SAMPLES,
    MAX_SERIES,
    NO_DEADLINE,
    Deadline,
    LimitExceeded,
    parallel_map,
    too_many,
)
from .wanted import WANTED_SERIES

MAX_POINTS = 240  # per series over the window: enough for a timeline, cheap at 24 h
# One query_range answer: one metric name, 240 points per series; a 64-rank
# engine's largest is ~2 MB. Smaller than MAX_BODY_BYTES: eight are in flight.
MAX_ANSWER_BYTES = 8 << 20
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
    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT_S,
                 deadline: Deadline = NO_DEADLINE):
        self.base = http.check_url(url, "Prometheus").rstrip("/")
        self.timeout = timeout
        self.deadline = deadline

    def _get(self, path: str, params: dict) -> bytes:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        return http.get(url, self.timeout, "Prometheus", self.deadline, MAX_ANSWER_BYTES)

    def _data(self, path: str, body: bytes) -> dict:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise DiagnoseError(
                f"{self.base} does not look like a Prometheus API (no JSON from {path})"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error", "unknown error") if isinstance(doc, dict) else "unexpected reply"
            raise DiagnoseError(f"Prometheus rejected the query: {str(err)[:200]}")
        data = doc.get("data") or {}
        if not isinstance(data, dict):
            raise DiagnoseError(f"{self.base}: unexpected answer from {path} (data is not an object)")
        return data

    def _api(self, path: str, params: dict) -> dict:
        return self._data(path, self._get(path, params))

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr, "timeout": f"{self.timeout:g}s"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._api("/api/v1/query", params).get("result", [])

    def fetch_range(self, expr: str, start: float, end: float, step: float) -> bytes:
        params = {
            "query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}",
            "timeout": f"{self.timeout:g}s",
        }
        return self._get("/api/v1/query_range", params)

    def parse_range(self, body: bytes) -> list:
        data = self._data("/api/v1/query_range", body)
        if data.get("resultType") not in (None, "matrix"):
            raise DiagnoseError(f"{self.base}: unexpected result type {str(data.get('resultType'))[:40]!r}")
        result = data.get("result", [])
        if not isinstance(result, list):
            raise DiagnoseError(f"{self.base}: unexpected answer (result is not a list)")
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self.parse_range(self.fetch_range(expr, start, end, step))

    def fetch_instant(self, expr: str, at: float) -> bytes:
        params = {"query": expr, "time": f"{at:.3f}", "timeout": f"{self.timeout:g}s"}
        return self._get("/api/v1/query", params)

    def parse_instant(self, body: bytes) -> list:
        data = self._data("/api/v1/query", body)
        if data.get("resultType") not in (None, "vector"):
            kind = str(data.get("resultType"))[:40]
            raise DiagnoseError(f"{self.base}: unexpected result type {kind!r}")
        result = data.get("result", [])
        if not isinstance(result, list):
            raise DiagnoseError(f"{self.base}: unexpected answer (result is not a list)")
        # an instant vector's one point, in a range answer's shape
        return [{**r, "values": [r.get("value")]} if isinstance(r, dict) else r for r in result]

    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        """Values of ``label`` on the series matching ``match`` in [start, end] (the index)."""
        body = self._get(f"/api/v1/label/{label}/values",
                         {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise DiagnoseError(f"{self.base} does not look like a Prometheus API") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error", "unknown error") if isinstance(doc, dict) else "unexpected reply"
            raise DiagnoseError(f"Prometheus rejected the query: {str(err)[:200]}")
        data = doc.get("data")
        if not isinstance(data, list):
            raise DiagnoseError(f"{self.base}: unexpected answer from the label values API")
        return [str(v) for v in data]


def _series(queried: str, name: str, r, url: str) -> Series | None:
    if not isinstance(r, dict) or not isinstance(r.get("metric", {}), dict):
        raise DiagnoseError(f"{url}: malformed series in the answer for {queried}")
    metric = {str(k): str(v) for k, v in r.get("metric", {}).items()}
    metric.pop("__name__", None)
    target = metric.get("instance", "") or metric.get("job", "")
    try:
        samples = tuple((float(t), float(v)) for t, v in r.get("values", []))
    except (TypeError, ValueError):
        raise DiagnoseError(f"{url}: malformed sample values for {queried}") from None
    return Series(name, tuple(sorted(metric.items())), target, samples) if samples else None


def prometheus_window(
    url: str,
    start: float,
    end: float,
    selector: str = "",
    timeout: float = DEFAULT_TIMEOUT_S,
    names: frozenset[str] = WANTED_SERIES,
    deadline: Deadline = NO_DEADLINE,
) -> RawWindow:
    if end <= start:
        raise DiagnoseError(f"empty window: end ({end:.0f}) is not after start ({start:.0f})")
    sel = normalize_selector(selector)
    client = PrometheusClient(url, timeout, deadline)
    step = step_for(start, end)
    # Probe once: a wrong URL or a dead server fails here with one clear line.
    client.query("vector(1)", at=end)
    # (name as queried, name kv-diagnose knows it by)
    queries = [(n, n) for n in sorted(names)]
    queries += [(e, n) for n in sorted(names) if (e := escaped_name(n))]
    kept = [0, 0]  # series, samples over every answer so far
    keep = _keeper(kept)
    if long_window.is_long(start, end, step):
        series, failures, points = long_window.read(
            client, start, end, sel, dict(queries), MAX_POINTS, _series, deadline, keep,
            room=lambda: MAX_SAMPLES - kept[1])
        raw = _window(client, start, end, sel, series, failures, long_window.TAIL_S)
        return dataclasses.replace(raw, notes=(long_window.note(start, end, points),
                                               *raw.notes))

    def fetch(q: tuple[str, str]) -> list[Series]:
        queried, name = q
        if kept[1] > MAX_SAMPLES:  # over the cap already: fetch no more
            raise too_many("samples", MAX_SAMPLES, "narrow the window or the --selector")
        body = client.fetch_range(query_for(queried, sel), start, end, step)
        return keep(body, lambda b: [s for r in client.parse_range(b)
                                     if (s := _series(queried, name, r, url))])

    results = parallel_map(fetch, queries, 8, deadline)
    fatal = next((r for r in results if isinstance(r, LimitExceeded)), None)
    if fatal is not None:
        raise fatal
    series: list[Series] = []
    failures: list[str] = []
    first_error: DiagnoseError | None = None
    seen: set[tuple[str, tuple]] = set()
    for (queried, name), result in zip(queries, results, strict=True):
        if isinstance(result, DiagnoseError):
            # One query that fails (a timeout on a heavy series, a 503 from one
            # Thanos store) costs that series, not the diagnosis: the checks
            # that need it say "could not check".
            failures.append(f"query for {queried} failed: {result}")
            first_error = first_error or result
            continue
        if isinstance(result, BaseException):
            raise result
        for s in result:
            if (name, s.labels) in seen:  # stored under both spellings: the real name wins
                continue
            seen.add((name, s.labels))
            series.append(s)
    if first_error is not None and len(failures) == len(queries):
        raise first_error  # every query failed the same way: the selector, the server
    return _window(client, start, end, sel, series, failures,
                   max(2 * step, min(300.0, (end - start) / 5)))


def _keeper(kept: list[int]):
    """``keep(body, parse, fresh=len)``: count an answer against the caps, then parse it;
    ``fresh(parsed)``: how many of its series are new to the window (a long window's
    answers each bring back series of the others: prometheus_long.py).

    Each answer is parsed and turned into compact Series in its worker, one at a
    time (a lock): at most one JSON document is alive at once, so memory is the
    bodies in flight plus what is kept, never eight parsed documents.
    """
    parse_lock = threading.Lock()

    def keep(body: bytes, parse, fresh=len):
        with parse_lock:
            # Counted before parsing builds them: '[' opens each sample pair.
            kept[1] += body.count(b"[")
            if kept[1] > MAX_SAMPLES + MAX_SERIES:
                raise too_many("samples", MAX_SAMPLES, "narrow the window or the --selector")
            out = parse(body)
            kept[0] += fresh(out)
            if kept[0] > MAX_SERIES:
                raise too_many("series", MAX_SERIES, "narrow it with --selector")
            return out
    return keep


def _window(client: PrometheusClient, start: float, end: float, sel: str, series,
            failures: list[str], recent_span: float) -> RawWindow:
    src = SourceInfo(
        kind="prometheus",
        location=client.base,
        start=start,
        end=end,
        now=end,
        lifetime=False,
        recent_span=recent_span,
        selector=("{" + sel + "}") if sel else "",
    )
    # Notes, not failures: a query that failed is no sign of the engine's health;
    # the checks that need its series report them missing.
    return RawWindow(src, tuple(series), notes=_summarise(failures))


def _summarise(failures: list[str]) -> tuple[str, ...]:
    """At most a few lines: 40 queries failing the same way say it once."""
    if len(failures) <= 3:
        return tuple(failures)
    return (*failures[:2], f"... and {len(failures) - 2} more queries failed")
