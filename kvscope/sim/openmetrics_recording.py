"""Record /metrics endpoints every second and write them as timestamped OpenMetrics.

What an operator's Prometheus would have stored, kept in a file: each scrape's
samples get the ``job``/``instance`` labels a scrape config adds and an ``up``
sample, and the file is what ``promtool tsdb create-blocks-from openmetrics``
backfills (one family per block of lines, samples in time order, ``# EOF``).

Only the series kvscope's rules, dashboards and kv-diagnose read are kept
(``kvscope_*`` and the ``vllm:`` series named in the signal contract), so a
recording of minutes stays small enough to commit.
"""

from __future__ import annotations

import gzip
import json
import math
import threading
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kvscope.exporters import signals

KEEP_PREFIXES = (signals.PREFIX,)
KEEP_VLLM = tuple(sorted({
    v.removesuffix("_total") for k, v in vars(signals).items()
    if k.startswith("VLLM_") and isinstance(v, str) and v.startswith("vllm:")}))
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_info")


@dataclass(frozen=True)
class Target:
    url: str
    job: str
    instance: str


@dataclass
class Family:
    name: str
    kind: str  # counter | gauge | histogram | unknown
    help: str = ""
    # (sample name, sorted label items) -> [(timestamp, value)]
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = field(
        default_factory=dict)


def _kept(name: str) -> bool:
    return name.startswith(KEEP_PREFIXES) or name in KEEP_VLLM


class Recording:
    """Samples of many scrapes, grouped by family (OpenMetrics wants each family in one block)."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}
        self._lock = threading.Lock()

    def add_text(self, text: str, target: Target, ts: float) -> None:
        extra = (("instance", target.instance), ("job", target.job))
        with self._lock:
            for fam in text_string_to_metric_families(text):
                if not _kept(fam.name):
                    continue
                kind = fam.type if fam.type in ("counter", "gauge", "histogram") else "unknown"
                f = self.families.setdefault(fam.name, Family(fam.name, kind, fam.documentation))
                for s in fam.samples:
                    if s.name.endswith("_created"):
                        continue
                    labels = tuple(sorted({**s.labels, **dict(extra)}.items()))
                    f.series.setdefault((s.name, labels), []).append((ts, float(s.value)))
            self._add_up(target, ts, 1.0)

    def add_down(self, target: Target, ts: float) -> None:
        with self._lock:
            self._add_up(target, ts, 0.0)

    def _add_up(self, target: Target, ts: float, value: float) -> None:
        f = self.families.setdefault("up", Family("up", "gauge", "scrape succeeded"))
        key = ("up", (("instance", target.instance), ("job", target.job)))
        f.series.setdefault(key, []).append((ts, value))

    def openmetrics(self) -> Iterable[str]:
        with self._lock:
            for fam in sorted(self.families.values(), key=lambda f: f.name):
                yield f"# TYPE {fam.name} {fam.kind}\n"
                if fam.help:
                    yield f"# HELP {fam.name} {_escape(fam.help)}\n"
                for (name, labels), points in sorted(fam.series.items()):
                    lbl = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                    head = f"{name}{{{lbl}}}" if lbl else name
                    for ts, value in sorted(points):
                        yield f"{head} {_number(value)} {ts:.3f}\n"
            yield "# EOF\n"

    def write(self, path: str) -> None:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wt") as f:
            f.writelines(self.openmetrics())


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(int(v)) if v == int(v) and abs(v) < 2**53 else repr(v)


class Recorder:
    """Scrape every target each ``interval`` seconds on a thread, into a Recording."""

    def __init__(self, targets: list[Target], interval: float = 1.0, timeout: float = 3.0) -> None:
        self.targets = targets
        self.interval = interval
        self.timeout = timeout
        self.recording = Recording()
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="recorder", daemon=True)

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        next_at = time.time()
        while not self._stop.is_set():
            self.scrape_once()
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.time()))

    def scrape_once(self) -> None:
        for t in self.targets:
            ts = time.time()
            try:
                with urllib.request.urlopen(t.url, timeout=self.timeout) as resp:
                    body = resp.read().decode()
                self.recording.add_text(body, t, ts)
                self.scrapes += 1
            except Exception:
                self.recording.add_down(t, ts)
                self.failures += 1


def phases_json(phases: list[dict], path: str) -> None:
    with open(path, "w") as f:
        json.dump(phases, f, indent=1)
