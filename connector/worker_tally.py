"""One rank's transfers between two flushes: which jobs are in flight, and what finished.

vLLM's worker thread (the engine thread with TP=1) keeps the tally per job with plain
dict and integer updates; :meth:`TransferTally.push` moves it into the rank's recorder
(one counter increment and one batch of durations per direction, the in-flight gauges
when they changed) and flushes. :class:`~kvscope.connector.worker_side.WorkerProxy`
pushes at most every ``flush_interval_s`` (kvscope's setting, default 50 ms) while
transfers keep coming, at once on a quiet step, and for a reader of the recorder (``Recorder.before_read``: a scrape of
the rank's endpoint sees every transfer finished before it). The lock keeps the
worker thread's sums and a reader's push apart, and one flush at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kvscope.exporters import signals
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import Direction

_DIRECTIONS = (Direction.GPU_TO_CPU, Direction.CPU_TO_GPU)


class TransferTally:
    def __init__(self, recorder: Recorder, rank_label: str) -> None:
        self._rec = recorder
        self._lock = threading.Lock()
        self._labels = {d: (rank_label, d.value) for d in _DIRECTIONS}
        # job id -> (direction, monotonic start, GPU blocks): the worker thread's alone
        self.jobs: dict[int, tuple[Direction, float, int]] = {}
        self._in_flight = dict.fromkeys(_DIRECTIONS, 0)
        self._shown: dict[Direction, int | None] = dict.fromkeys(_DIRECTIONS)  # on the recorder
        self._bytes = dict.fromkeys(_DIRECTIONS, 0)  # finished since the last push
        self._seconds: dict[Direction, list[float]] = {d: [] for d in _DIRECTIONS}
        self.active = False  # a job started or finished since the worker last looked
        self.pending = False  # ... since the last push

    def start(self, job_id: int, direction: Direction, blocks: int) -> None:
        jobs = self.jobs
        old = jobs.get(job_id)
        if old is not None:  # a job id reused while in flight: counted once
            self._in_flight[old[0]] -= 1
        jobs[job_id] = (direction, time.monotonic(), blocks)
        self._in_flight[direction] += 1
        self.active = self.pending = True

    def finish(self, results: list, slot_size: int | None,
               on_transfer: Callable[[int, Direction, int | None, float], None] | None) -> None:
        """vLLM's TransferResults of one get_finished: sizes (the job's blocks times the
        slot size when vLLM reports none) and durations (since submission when vLLM
        reports none) summed per direction; failed jobs only leave the in-flight count."""
        self.active = self.pending = True
        jobs, in_flight, now = self.jobs, self._in_flight, None
        with self._lock:
            for res in results:
                job = jobs.pop(res.job_id, None)
                if job is None:
                    continue
                direction, started, blocks = job
                in_flight[direction] -= 1
                if not res.success:
                    continue
                size = res.transfer_size
                if size is None and slot_size is not None:
                    size = blocks * slot_size
                seconds = res.transfer_time
                if seconds is None:
                    if now is None:
                        now = time.monotonic()
                    seconds = now - started
                self._bytes[direction] += size or 0
                self._seconds[direction].append(seconds)
                if on_transfer is not None:
                    on_transfer(res.job_id, direction, size, seconds)

    def push(self) -> None:
        """Everything tallied since the last push into the recorder, then its flush."""
        rec = self._rec
        with self._lock:
            self.pending = False
            for direction, seconds in self._seconds.items():
                if seconds:
                    labels = self._labels[direction]
                    self._seconds[direction] = []
                    size, self._bytes[direction] = self._bytes[direction], 0
                    rec.inc(signals.TRANSFER_BYTES, labels, size)
                    rec.observe_many(signals.TRANSFER_SECONDS, labels, seconds)
            shown = self._shown
            for direction, n in self._in_flight.items():
                if shown[direction] != n:
                    shown[direction] = n
                    rec.set(signals.TRANSFERS_IN_FLIGHT, self._labels[direction], n)
            rec.flush()
