"""What the soak samples of the process and of kvscope, read from the benchmark side.

Nothing here changes kvscope: the process's RSS from ``/proc/self/status``, the aggregator's
journal length from the observer object (:attr:`Aggregator.journal`), and everything else
from kvscope's own standalone endpoints, scraped over HTTP as Prometheus would (the
scheduler's and each rank's): the series they export, ``kvscope_telemetry_errors_total``
and the pending gauges. A scrape drains the journal first (``Recorder.before_read``), as a
real Prometheus scrape does.
"""

from __future__ import annotations

import gc
import threading
import time
import urllib.request
from collections import Counter, deque
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# The gauges that must read 0 once the engine has drained (nothing in flight, no request).
# kvscope_oldest_pending_transfer_seconds is 0 when nothing of its kind is pending.
PENDING_GAUGES = ("kvscope_pending_transfers", "kvscope_oldest_pending_transfer_seconds",
                  "kvscope_transfers_in_flight", "kvscope_requests_in_flight",
                  "kvscope_requests")
ERRORS = "kvscope_telemetry_errors_total"


def rss_kib() -> dict[str, int]:
    """This process's resident set (VmRSS) and its parts, KiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[name] = int(rest.split()[0])
    return out


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """One scrape of a kvscope endpoint: sample name -> [(labels, value)]."""
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), s.value))
    return samples


def kvscope_view(urls: list[str]) -> dict[str, Any]:
    """Series count, telemetry errors (by ``where``) and pending gauges over ``urls``."""
    series = 0
    errors: Counter[str] = Counter()
    pending: dict[str, float] = {}
    for url in urls:
        samples = scrape(url)
        series += sum(len(v) for v in samples.values())
        for labels, value in samples.get(ERRORS, ()):
            if value:
                errors[labels.get("where", "")] += value
        for name in PENDING_GAUGES:
            for labels, value in samples.get(name, ()):
                key = name + "".join(f",{k}={v}" for k, v in sorted(labels.items())
                                     if k not in ("model_name", "engine"))
                pending[key] = pending.get(key, 0.0) + value
    return {"series": series, "errors": sum(errors.values()), "errors_by_where": dict(errors),
            "pending_nonzero": {k: v for k, v in pending.items() if v}}


def state_sizes(observer: Any) -> dict[str, int]:
    """Lengths of the containers kvscope's scheduler-side rooms hold, one level deep
    (``room.attr``): where kvscope's state would grow if it kept something per key or per
    request. Read under the aggregator's lock (its thread changes them)."""
    sizes: dict[str, int] = {}
    with observer.agg.lock:
        rooms = [("observer", observer)] + [(k, v) for k, v in vars(observer).items()
                                             if type(v).__module__.startswith("kvscope.")]
        for room_name, room in rooms:
            for attr, value in _attributes(room):
                if isinstance(value, (dict, list, set, deque, bytearray)):
                    sizes[f"{room_name}.{attr}"] = len(value)
    return sizes


def _attributes(obj: Any) -> list[tuple[str, Any]]:
    """An object's attributes, whether in its ``__dict__`` or in ``__slots__``."""
    if hasattr(obj, "__dict__"):
        return list(vars(obj).items())
    names = [n for cls in type(obj).__mro__ for n in getattr(cls, "__slots__", ())]
    return [(n, getattr(obj, n)) for n in names if hasattr(obj, n)]


class JournalWatch:
    """The aggregator's journal length, polled on a thread of its own: its largest length
    between two samples (the journal empties at every aggregation, so a sample alone would
    miss a backlog)."""

    def __init__(self, journal: list, interval_s: float = 0.05) -> None:
        self._journal = journal
        self._interval_s = interval_s
        self._max = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-journal-watch",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            n = len(self._journal)
            if n > self._max:
                self._max = n

    def take_max(self) -> int:
        """The largest length seen since the last call (and now)."""
        out, self._max = max(self._max, len(self._journal)), 0
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Scraper:
    """Prometheus's cadence: scrapes every endpoint every ``interval_s`` from a thread of
    its own, as a real server would while the engine runs; counts failed scrapes."""

    def __init__(self, urls: list[str], interval_s: float) -> None:
        self.urls = urls
        self.scrapes = self.failures = 0
        self.last_failure = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-scraper", daemon=True)
        if interval_s > 0:
            self._interval_s = interval_s
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            for url in self.urls:
                try:
                    scrape(url)
                    self.scrapes += 1
                except Exception as exc:  # counted and reported: the soak fails on it
                    self.failures += 1
                    self.last_failure = repr(exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=35)


def sample(engine: Any, urls: list[str], watch: JournalWatch, started: float,
           phase_counts: dict[str, int]) -> dict[str, Any]:
    """One sample: process, kvscope (journal, endpoints, state sizes) and the engine."""
    observer = engine.connector._kvscope_observer
    t = time.monotonic() - started
    rss = rss_kib()
    view = kvscope_view(urls)
    sizes = state_sizes(observer)
    return {"t_s": round(t, 1), "rss_kib": rss["VmRSS"], "rss_anon_kib": rss.get("RssAnon"),
            "rss_file_kib": rss.get("RssFile"), "rss_shmem_kib": rss.get("RssShmem"),
            "journal_len": len(observer.agg.journal), "journal_len_max": watch.take_max(),
            "series": view["series"], "telemetry_errors": view["errors"],
            "errors_by_where": view["errors_by_where"], "pending_nonzero": view["pending_nonzero"],
            "kvscope_state_items": sum(sizes.values()),
            "kvscope_state_largest": dict(sorted(sizes.items(), key=lambda kv: -kv[1])[:5]),
            "gc_objects": len(gc.get_objects()), "engine_steps": engine.steps,
            "engine_requests": len(engine.scheduler.requests), "phases": dict(phase_counts)}
