"""A real Prometheus for tests: 127.0.0.1 only, free port, fresh TSDB, polled readiness.

Usage::

    from tests.support.prometheus import running_prometheus

    with running_prometheus(["http://127.0.0.1:9400/metrics"], rule_files=[path]) as prom:
        prom.wait_for("kvscope_scheduler_steps_total", timeout=30)
        series = prom.query('sum by (verdict) (rate(kvscope_lookup_rounds_total[1m]))')

``running_prometheus`` returns only once Prometheus is ready *and* every target has been
scraped successfully at least once (Prometheus batches service-discovery updates for ~5 s, so
the first sample appears 5-6 s after start; never sleep, poll). ``require_binaries()`` skips
the calling test when the Debian ``prometheus`` package is not installed. The ``prometheus``
fixture in ``tests/conftest.py`` wraps ``running_prometheus`` as a factory.

Queries return Prometheus' ``data.result`` list (vector: ``[{"metric": {...}, "value": [t, "v"]}]``,
matrix: ``[{"metric": {...}, "values": [[t, "v"], ...]}]``); a query Prometheus rejects raises
``PromQLError`` carrying Prometheus' own message.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import yaml

__all__ = [
    "RESTORE_VLLM_COLONS", "Prometheus", "PromQLError", "PrometheusStartError", "free_port",
    "require_binaries", "running_prometheus",
]

HOST = "127.0.0.1"


class PromQLError(Exception):
    """Prometheus answered a query with an error (bad_data: the PromQL does not parse, ...)."""

    def __init__(self, expr: str, error_type: str, error: str) -> None:
        super().__init__(f"{error_type}: {error}\n  in: {expr}")
        self.expr, self.error_type, self.error = expr, error_type, error


class PrometheusStartError(RuntimeError):
    pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def require_binaries(*names: str) -> None:
    """pytest.skip() unless every binary (default: prometheus and promtool) is on PATH."""
    import pytest

    missing = [n for n in (names or ("prometheus", "promtool")) if shutil.which(n) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (Debian: apt-get install prometheus)")


class Prometheus:
    """HTTP API client of one running Prometheus."""

    def __init__(self, url: str, log_path: Path | None = None) -> None:
        self.url = url.rstrip("/")
        self.log_path = log_path

    # ---- raw API ----------------------------------------------------------------------------
    def api(self, path: str, params: dict[str, str] | None = None, expr: str = "") -> object:
        """GET ``/api/v1/<path>``; returns ``data``; raises PromQLError on an API error."""
        query = urllib.parse.urlencode(params or {})
        req = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as err:  # 400/422/503 carry a JSON error body
            try:
                body = json.load(err)
            except ValueError:
                raise PromQLError(expr, f"http {err.code}", str(err)) from err
        if body.get("status") != "success":
            raise PromQLError(expr, body.get("errorType", "?"), body.get("error", "?"))
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query; returns the result list (empty when nothing matches)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", params, expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
        data = self.api("query_range", {"query": expr, "start": f"{start:.3f}",
                                        "end": f"{end:.3f}", "step": str(step)}, expr)
        return data["result"]

    def targets(self) -> list[dict]:
        return self.api("targets", {"state": "active"})["activeTargets"]

    def rules(self) -> list[dict]:
        return self.api("rules")["groups"]

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]

    # ---- polling ----------------------------------------------------------------------------
    def wait_for(self, expr: str, predicate: Callable[[list[dict]], bool] = bool,
                 timeout: float = 30.0, interval: float = 0.25) -> list[dict]:
        """Poll ``query(expr)`` until ``predicate(result)`` holds; return that result.

        Raises TimeoutError with the last result (or query error) when it never does.
        """
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                last = self.query(expr)
                if predicate(last):
                    return last
            except PromQLError as err:
                if err.error_type == "bad_data":
                    raise
                last = err
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expr!r} not satisfied after {timeout}s; last: {last!r}"
                                   f"{self._log_tail()}")
            time.sleep(interval)

    def wait_targets_up(self, count: int, timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        targets: list[dict] = []
        while time.monotonic() < deadline:
            targets = self.targets()
            if len(targets) >= count and all(t["health"] == "up" for t in targets):
                return targets
            time.sleep(0.2)
        raise TimeoutError(f"targets not up after {timeout}s: "
                           f"{[(t['scrapeUrl'], t['health'], t['lastError']) for t in targets]}"
                           f"{self._log_tail()}")

    def _log_tail(self) -> str:
        if self.log_path and self.log_path.exists():
            return "\n--- prometheus log (tail) ---\n" + "\n".join(
                self.log_path.read_text(errors="replace").splitlines()[-20:])
        return ""


# prometheus_client 0.26 answers Prometheus 2.x's OpenMetrics Accept header (no escaping=
# parameter, so "underscores") with sample names whose colons became underscores, while HELP/TYPE
# keep them: vLLM's "vllm:num_requests_running" is stored as "vllm_num_requests_running"
# (prometheus/client_python#1177). Prometheus 3 (escaping=allow-utf-8) and the text format are
# unaffected. Pass this as ``metric_relabel_configs`` to store vLLM's names as vLLM spells them.
RESTORE_VLLM_COLONS: list[dict] = [{
    "source_labels": ["__name__"],
    "regex": "vllm_(.+)",
    "target_label": "__name__",
    "replacement": "vllm:$1",
}]


def _scrape_configs(targets: Sequence[str], job: str, interval: str,
                    metric_relabel_configs: Sequence[dict] = ()) -> list[dict]:
    by_path: dict[tuple[str, str], list[str]] = {}
    for target in targets:
        parsed = urllib.parse.urlsplit(target if "://" in target else f"http://{target}")
        if parsed.hostname not in (HOST, "localhost"):
            raise ValueError(f"tests scrape 127.0.0.1 only, not {target!r}")
        by_path.setdefault((parsed.scheme, parsed.path or "/metrics"), []).append(parsed.netloc)
    configs = []
    for i, ((scheme, path), netlocs) in enumerate(sorted(by_path.items())):
        configs.append({
            "job_name": job if i == 0 else f"{job}-{i}",
            "scheme": scheme,
            "metrics_path": path,
            "scrape_interval": interval,
            "static_configs": [{"targets": netlocs}],
        })
        if metric_relabel_configs:
            configs[-1]["metric_relabel_configs"] = list(metric_relabel_configs)
    return configs


@contextmanager
def running_prometheus(
    targets: Sequence[str] = (),
    rule_files: Iterable[str | Path] = (),
    *,
    job: str = "kvscope",
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    workdir: str | Path | None = None,
    timeout: float = 30.0,
    wait_targets: bool = True,
    metric_relabel_configs: Sequence[dict] = (),
    retention: str = "1d",
) -> Iterator[Prometheus]:
    """Start ``prometheus`` on 127.0.0.1:<free port>, yield a client, stop it on exit.

    ``targets`` are URLs (``http://127.0.0.1:PORT/metrics``) or ``127.0.0.1:PORT``; all get the
    job label ``job``. ``rule_files`` are loaded as given (note: a rule group's own
    ``interval:`` overrides ``evaluation_interval``). The TSDB and the log live in ``workdir``
    (a fresh temporary directory by default, removed afterwards). With ``wait_targets=False``
    it returns as soon as Prometheus is ready (for targets that come up later: call
    ``prom.wait_targets_up(n)`` then). ``metric_relabel_configs`` apply to every target (see
    ``RESTORE_VLLM_COLONS``). ``retention``: keep a backfilled history older than a day.
    """
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusStartError("prometheus not on PATH (Debian: apt-get install prometheus)")
    owned = workdir is None
    root = Path(tempfile.mkdtemp(prefix="kvscope-prom-") if owned else workdir)
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": _scrape_configs(list(targets), job, scrape_interval,
                                          metric_relabel_configs),
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    log_path = root / "prometheus.log"
    proc = None
    try:
        for _attempt in range(3):  # the free port may be taken between probe and bind
            port = free_port()
            log = log_path.open("w")
            proc = subprocess.Popen(
                [binary, f"--config.file={root / 'prometheus.yml'}",
                 f"--storage.tsdb.path={root / 'data'}",
                 f"--web.listen-address={HOST}:{port}",
                 f"--storage.tsdb.retention.time={retention}", "--log.level=info"],
                stdout=log, stderr=subprocess.STDOUT, cwd=root,
            )
            log.close()
            prom = Prometheus(f"http://{HOST}:{port}", log_path)
            if wait_http_ready(f"{prom.url}/-/ready", proc, timeout):
                break
            proc.wait(timeout=10)
            if "address already in use" not in log_path.read_text(errors="replace"):
                raise PrometheusStartError(f"prometheus did not become ready{prom._log_tail()}")
        else:
            raise PrometheusStartError("no free port after 3 attempts")
        if targets and wait_targets:
            prom.wait_targets_up(len(targets), timeout)
        yield prom
    finally:
        stop(proc)
        if owned:
            shutil.rmtree(root, ignore_errors=True)


def wait_http_ready(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    """Poll ``url`` until it answers 200 (True), the process exits or ``timeout`` passes
    (False; the process is then terminated). Prometheus's and VictoriaMetrics' start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    proc.terminate()
    return False


def stop(proc: subprocess.Popen | None) -> None:
    """Terminate a server the tests started (killed if it does not exit in 10 s)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
