"""Source (b): live /metrics endpoints, scraped twice ``interval`` apart.

The window is the process lifetime up to the second scrape: counters are
lifetime totals, and the change between the two scrapes says whether it is
still happening.

A target that does not answer, or answers something unreadable, is listed in
``RawWindow.failures`` and the diagnosis runs on the others: during an incident
the dead rank is the likeliest culprit, not a reason to give up.
"""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.parser import text_string_to_metric_families

from ..model import DiagnoseError, RawWindow, Series, SourceInfo
from . import http
from .limits import DEFAULT_TIMEOUT_S, MAX_SERIES, NO_DEADLINE, Deadline, parallel_map, too_many
from .wanted import WANTED_SERIES

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _wanted_lines(text: str, target: str) -> Iterator[str]:
    """Sample lines of the series kv-diagnose needs (everything else is skipped
    unparsed: a huge exposition costs its bytes, not millions of objects)."""
    kept = 0
    for line in io.StringIO(text):
        m = _NAME.match(line)
        if m is None or m.group() not in WANTED_SERIES:
            continue  # comments, blank lines, other series
        kept += 1
        if kept > MAX_SERIES:
            raise too_many(f"kvscope series from {target}", MAX_SERIES,
                           "is that one process's /metrics?")
        yield line if line.endswith("\n") else line + "\n"


def parse_exposition(text: str, target: str, ts: float) -> list[tuple[str, tuple, float]]:
    """(series name, sorted labels, value) of the series kv-diagnose needs."""
    out = []
    try:
        wanted = "".join(_wanted_lines(text, target))
        for fam in text_string_to_metric_families(wanted):
            for s in fam.samples:
                if s.name in WANTED_SERIES:
                    out.append((s.name, tuple(sorted(s.labels.items())), float(s.value)))
    except DiagnoseError:
        raise
    except Exception as e:  # the parser raises ValueError, IndexError, ... on bad text
        msg = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise DiagnoseError(f"malformed exposition text from {target}: {msg}") from None
    return out


def scrape_window(
    urls: Sequence[str],
    interval: float = 1.0,
    timeout: float = DEFAULT_TIMEOUT_S,
    clock: Callable[[], float] = time.time,
    wait: Callable[[float], None] = time.sleep,
    deadline: Deadline = NO_DEADLINE,
) -> RawWindow:
    if not urls:
        raise DiagnoseError("--scrape needs at least one URL")
    if interval <= 0:
        raise DiagnoseError(f"--interval must be > 0 s, got {interval:g}")
    urls = list(dict.fromkeys(http.check_url(u, "metrics") for u in urls))  # each once
    failed: dict[str, str] = {}  # url -> why (first failure wins)
    samples: dict[tuple[str, tuple, str], list[tuple[float, float]]] = {}
    times: list[float] = []

    parse_lock = threading.Lock()

    def one(url: str) -> list[tuple[str, tuple, float]]:
        body = http.get(url, timeout, "metrics endpoint", deadline)
        with parse_lock:  # one decoded text at a time: bodies in flight are the bound
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise DiagnoseError(f"malformed exposition text from {url}: not UTF-8") from None
            del body
            return parse_exposition(text, url, t)

    for i in range(2):
        if i:
            if interval >= deadline.remaining():
                raise deadline.expired()
            wait(interval)
        t = clock()
        times.append(t)
        live = [u for u in urls if u not in failed]
        for url, got in zip(live, parallel_map(one, live, 8, deadline), strict=True):
            if isinstance(got, DiagnoseError):
                failed[url] = str(got)
                continue
            if isinstance(got, BaseException):
                raise got
            for name, labels, value in got:
                smp = samples.setdefault((name, labels, url), [])
                # The same series twice in one exposition (an exporter bug):
                # keep the first, as Prometheus does, so both sources agree.
                if not smp or smp[-1][0] != t:
                    smp.append((t, value))
            if len(samples) > MAX_SERIES:
                raise too_many("kvscope series over all targets", MAX_SERIES,
                               "scrape fewer targets at once")
    if len(failed) == len(urls):
        raise DiagnoseError("; ".join(failed.values()) if len(urls) > 1 else failed[urls[0]])
    ok = [u for u in urls if u not in failed]
    t0, t1 = times
    src = SourceInfo(
        kind="scrape",
        location=" ".join(ok),
        start=t0,
        end=t1,
        now=t1,
        lifetime=True,
        recent_span=t1 - t0,
    )
    series = tuple(
        Series(name, labels, url, tuple(smp)) for (name, labels, url), smp in sorted(samples.items())
    )
    return RawWindow(src, series, failures=tuple(failed.values()))
