"""A real VictoriaMetrics for tests: 127.0.0.1 only, free port, fresh data dir, polled readiness.

Usage::

    from tests.support.victoriametrics import running_victoriametrics

    with running_victoriametrics() as vm:
        vm.import_openmetrics(Path("tests/fixtures/campaign-cpu/faults-cpu.om.gz"))
        vm.query("sum(kvscope_row_checksums_total)", at=t)

``VictoriaMetrics`` is the Prometheus client of ``tests/support/prometheus.py`` (VictoriaMetrics
serves the same ``/api/v1/query``, ``/query_range``, ``/series``, ``/labels`` API) plus ingestion
through ``/api/v1/import/prometheus`` and a flush that makes what was imported searchable at
once. ``require_binaries()`` skips the calling test unless Debian's ``victoria-metrics`` (which
ships ``vmalert``) is installed (``make prometheus`` installs both engines).

The server runs with VictoriaMetrics' defaults (its query engine, staleness detection and
caches as a user's would) except: retention of 100 years (the recorded campaigns are older than
the default month) and self-scraping off (its own series would mix with the campaign's).
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .prometheus import HOST, Prometheus, PrometheusStartError, free_port, stop, wait_http_ready

__all__ = ["VictoriaMetrics", "openmetrics_to_text", "require_binaries",
           "running_victoriametrics"]

BINARY = "victoria-metrics"


def require_binaries(*names: str) -> None:
    """pytest.skip() unless every binary (default: victoria-metrics and vmalert) is on PATH."""
    import pytest

    missing = [n for n in (names or (BINARY, "vmalert")) if shutil.which(n) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed "
                    "(Debian: apt-get install victoria-metrics, or make prometheus)")


# An OpenMetrics sample line: series, value, timestamp in seconds (the recordings' format).
_SAMPLE = re.compile(r"^(?P<series>[^#\s][^ ]*(?:\{.*\})?) (?P<value>\S+) (?P<ts>[0-9.e+-]+)$")


def openmetrics_to_text(lines: Iterable[str]) -> Iterator[str]:
    """OpenMetrics sample lines -> Prometheus text lines (timestamps in ms, what the text
    format and VictoriaMetrics' import expect). Comments (# HELP/TYPE/UNIT, # EOF) are dropped:
    every sample is kept, as ``promtool tsdb create-blocks-from openmetrics`` keeps them."""
    for line in lines:
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"not an OpenMetrics sample line with a timestamp: {line[:200]!r}")
        yield f"{m['series']} {m['value']} {round(float(m['ts']) * 1000)}\n"


class VictoriaMetrics(Prometheus):
    """HTTP API client of one running VictoriaMetrics (query API as for Prometheus)."""

    def _post(self, path: str, body: bytes) -> None:
        req = urllib.request.Request(f"{self.url}{path}", data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                resp.read()
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"POST {path}: {err.code} {err.read()[:500]!r}"
                               f"{self._log_tail()}") from err

    def import_text(self, lines: Iterable[str], chunk_lines: int = 50_000) -> int:
        """POST Prometheus text lines (with ms timestamps) to /api/v1/import/prometheus."""
        count, chunk = 0, []
        for line in lines:
            chunk.append(line)
            if len(chunk) >= chunk_lines:
                self._post("/api/v1/import/prometheus", "".join(chunk).encode())
                count, chunk = count + len(chunk), []
        if chunk:
            self._post("/api/v1/import/prometheus", "".join(chunk).encode())
            count += len(chunk)
        return count

    def import_openmetrics(self, path: Path) -> int:
        """Every sample of a (gzipped) OpenMetrics recording; returns the number of samples."""
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            return self.import_text(openmetrics_to_text(f))

    def flush(self) -> None:
        """Make every imported sample searchable now and drop cached query results (imports
        land in an in-memory buffer that becomes searchable within about a second)."""
        for path in ("/internal/force_flush", "/internal/resetRollupResultCache"):
            with urllib.request.urlopen(f"{self.url}{path}", timeout=60) as resp:
                resp.read()


@contextmanager
def running_victoriametrics(workdir: str | Path | None = None,
                            timeout: float = 30.0) -> Iterator[VictoriaMetrics]:
    """Start ``victoria-metrics`` on 127.0.0.1:<free port>, yield a client, stop it on exit.

    Data and log live in ``workdir`` (a fresh temporary directory by default, removed after).
    """
    binary = shutil.which(BINARY)
    if binary is None:
        raise PrometheusStartError(f"{BINARY} not on PATH (Debian: apt-get install {BINARY})")
    owned = workdir is None
    root = Path(tempfile.mkdtemp(prefix="kvscope-vm-") if owned else workdir)
    root.mkdir(parents=True, exist_ok=True)
    log_path = root / "victoria-metrics.log"
    proc = None
    try:
        for _attempt in range(3):  # the free port may be taken between probe and bind
            port = free_port()
            with log_path.open("w") as log:
                proc = subprocess.Popen(
                    [binary, f"-httpListenAddr={HOST}:{port}",
                     f"-storageDataPath={root / 'data'}", "-retentionPeriod=100y",
                     "-loggerLevel=WARN"],
                    stdout=log, stderr=subprocess.STDOUT, cwd=root,
                )
            vm = VictoriaMetrics(f"http://{HOST}:{port}", log_path)
            if wait_http_ready(f"{vm.url}/health", proc, timeout):
                break
            proc.wait(timeout=10)
            if "address already in use" not in log_path.read_text(errors="replace"):
                raise PrometheusStartError(f"victoria-metrics did not become ready"
                                           f"{vm._log_tail()}")
        else:
            raise PrometheusStartError("no free port after 3 attempts")
        yield vm
    finally:
        stop(proc)
        if owned:
            shutil.rmtree(root, ignore_errors=True)
