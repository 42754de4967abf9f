"""Source (b): live /metrics endpoints, scraped twice ``interval`` apart.

The window is the process lifetime up to the second scrape: counters are
lifetime totals, and the change between the two scrapes says whether it is
still happening.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

from . import http
from .evidence import WANTED_SERIES
from .model import DiagnoseError, RawWindow, Series, SourceInfo


def parse_exposition(text: str, target: str, ts: float) -> list[tuple[str, tuple, float]]:
    """(series name, sorted labels, value) of the series kv-diagnose needs."""
    out = []
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name in WANTED_SERIES:
                    out.append((s.name, tuple(sorted(s.labels.items())), float(s.value)))
    except Exception as e:  # the parser raises ValueError, IndexError, ... on bad text
        msg = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise DiagnoseError(f"malformed exposition text from {target}: {msg}") from None
    return out


def _fetch(url: str, timeout: float) -> str:
    body = http.get(url, timeout, "metrics endpoint")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise DiagnoseError(f"malformed exposition text from {url}: not UTF-8") from None


def scrape_window(
    urls: Sequence[str],
    interval: float = 1.0,
    timeout: float = 10.0,
    clock: Callable[[], float] = time.time,
    wait: Callable[[float], None] = time.sleep,
) -> RawWindow:
    if not urls:
        raise DiagnoseError("--scrape needs at least one URL")
    if interval <= 0:
        raise DiagnoseError(f"--interval must be > 0 s, got {interval:g}")
    urls = [http.check_url(u, "metrics") for u in urls]
    rounds: list[tuple[float, list[tuple[str, str]]]] = []
    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        for i in range(2):
            if i:
                wait(interval)
            t = clock()
            texts = list(pool.map(lambda u: _fetch(u, timeout), urls))
            rounds.append((t, list(zip(urls, texts, strict=True))))
    samples: dict[tuple[str, tuple, str], list[tuple[float, float]]] = {}
    for t, pairs in rounds:
        for url, text in pairs:
            for name, labels, value in parse_exposition(text, url, t):
                smp = samples.setdefault((name, labels, url), [])
                # The same series twice in one exposition (an exporter bug):
                # keep the first, as Prometheus does, so both sources agree.
                if not smp or smp[-1][0] != t:
                    smp.append((t, value))
    t0, t1 = rounds[0][0], rounds[1][0]
    src = SourceInfo(
        kind="scrape",
        location=" ".join(urls),
        start=t0,
        end=t1,
        now=t1,
        lifetime=True,
        recent_span=t1 - t0,
    )
    series = tuple(
        Series(name, labels, url, tuple(smp)) for (name, labels, url), smp in sorted(samples.items())
    )
    return RawWindow(src, series)
