"""Bounds on what kv-diagnose reads and how long it waits, on any input.

The sources are hostile in an incident: an endless /metrics body, a server that
drips a byte every few seconds, a bundle that inflates a thousandfold, a
relabel rule that explodes the series count. Each bound here fails with one
clear line instead of a hang or an out-of-memory kill; together they keep a
run under ~300 MB (measured in tests/diagnostics/test_fuzz.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from ..model import DiagnoseError

# One /metrics body. A vLLM /metrics of a 64-rank engine is a few MB; eight
# are fetched at once.
MAX_BODY_BYTES = 16 << 20
# A bundle after gunzip. A 24 h, 64-rank window is ~5 MB of JSON; MAX_SAMPLES
# samples are ~18 MB.
MAX_BUNDLE_BYTES = 24 << 20
# Series and samples kept from one source (a 24 h, 64-rank window: ~1,100
# series x 241 points).
MAX_SERIES = 20_000
MAX_SAMPLES = 600_000
# JSON containers ([ and {) and separators (,) a bundle may hold: counted in the
# raw text before parsing, since parsing 24 MB of "[0,0]," builds 4 M lists.
MAX_BUNDLE_CONTAINERS = MAX_SAMPLES + 4 * MAX_SERIES
MAX_BUNDLE_COMMAS = 3 * MAX_SAMPLES
# One label value (kvscope's longest, kvscope_info's spec, is ~100 characters);
# a series with a longer one is dropped with a note.
MAX_LABEL_CHARS = 1024
# The whole run (--deadline) and one request (--timeout), defaults.
DEFAULT_DEADLINE_S = 120.0
DEFAULT_TIMEOUT_S = 10.0


class LimitExceeded(DiagnoseError):
    """A cap was hit: the whole source is refused, not one target or query."""


def too_many(what: str, limit: int, hint: str) -> LimitExceeded:
    return LimitExceeded(f"more than {limit:,} {what}: {hint}")


class Deadline:
    """The run's deadline; every wait takes the smaller of its own bound and this."""

    def __init__(self, seconds: float = math.inf, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.seconds = seconds
        self.at = clock() + seconds

    def remaining(self) -> float:
        return self.at - self.clock()

    def bound(self, timeout: float) -> float:
        """min(timeout, time left); raises when none is left."""
        left = self.remaining()
        if left <= 0:
            raise self.expired()
        return min(timeout, left)

    def expired(self) -> DiagnoseError:
        return DiagnoseError(f"gave up after {self.seconds:g} s (--deadline): the sources did "
                             "not answer in time")


NO_DEADLINE = Deadline()

T = TypeVar("T")
R = TypeVar("R")


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int,
                 deadline: Deadline = NO_DEADLINE) -> list[R | BaseException]:
    """``fn`` over ``items`` on daemon threads; each result, or the exception it raised.

    Not a ThreadPoolExecutor: its worker threads are joined at interpreter exit,
    so a Ctrl-C (or the deadline) would still wait for a hung request. Daemon
    threads are abandoned instead, and the wait below wakes up often enough for
    KeyboardInterrupt to land at once.
    """
    items = list(items)
    results: list = [None] * len(items)
    done = threading.Semaphore(0)
    lock = threading.Lock()
    queue = list(enumerate(items))

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                i, item = queue.pop(0)
            try:
                results[i] = fn(item)
            except BaseException as e:  # noqa: BLE001  handed to the caller
                results[i] = e.with_traceback(None)  # its frames would keep their data alive
            done.release()

    for _ in range(max(1, min(workers, len(items)))):
        threading.Thread(target=worker, daemon=True, name="kv-diagnose-fetch").start()
    for _ in items:
        while not done.acquire(timeout=0.1):
            if deadline.remaining() <= 0:
                raise deadline.expired()
    return results


def first_error(results: Iterable) -> BaseException | None:
    return next((r for r in results if isinstance(r, BaseException)), None)
