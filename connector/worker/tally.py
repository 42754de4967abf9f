"""One rank's transfers between two flushes: which jobs are in flight, and what finished.

vLLM's worker thread (the engine thread with TP=1) keeps the tally per job with plain
dict and list updates (no enum-keyed dicts, no counters: in flight is a map's length);
:meth:`TransferTally.push` moves it into the rank's recorder (one counter increment and
one batch of durations per direction, the in-flight gauges when they changed) and
flushes. :class:`~kvscope.connector.worker.proxy.WorkerProxy` pushes at most every
``flush_interval_s`` (kvscope's setting, default 1 s) while transfers keep coming, at
once on a quiet step, and for a reader of the recorder (``Recorder.before_read``: a
scrape of the rank's endpoint sees every transfer finished before it). The lock keeps the
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
STORE, LOAD = 0, 1  # indexes of _DIRECTIONS: the per-direction lists' positions
_monotonic = time.monotonic


class TransferTally:
    def __init__(self, recorder: Recorder, rank_label: str) -> None:
        self._rec = recorder
        self._lock = threading.Lock()
        self._labels = [(rank_label, d.value) for d in _DIRECTIONS]
        # job id -> (monotonic start, GPU blocks), one map per direction (STORE, LOAD): the
        # worker thread's alone; a direction's in-flight count is its map's length
        self.stores: dict[int, tuple[float, int]] = {}
        self.loads: dict[int, tuple[float, int]] = {}
        self._shown: list[int | None] = [None, None]  # in flight, as on the recorder
        self._bytes = [0, 0]  # finished since the last push, per direction
        self._seconds: list[list[float]] = [[], []]
        self._failed = [0, 0]  # jobs vLLM's worker reported failed since the last push
        self.active = False  # a job started or finished since the worker last looked
        self.pending = False  # ... since the last push

    # One per submitted job on vLLM's worker thread: two dict operations and a clock read.
    # A job id reused while in flight is counted once (in its latest direction).
    def start_store(self, job_id: int, blocks: int) -> None:
        self.stores[job_id] = (_monotonic(), blocks)
        if job_id in self.loads:
            del self.loads[job_id]
        self.active = self.pending = True

    def start_load(self, job_id: int, blocks: int) -> None:
        self.loads[job_id] = (_monotonic(), blocks)
        if job_id in self.stores:
            del self.stores[job_id]
        self.active = self.pending = True

    def finish(self, results: list, slot_size: int | None,
               on_transfer: Callable[[int, Direction, int | None, float], None] | None) -> None:
        """vLLM's TransferResults of one get_finished: sizes (the job's blocks times the
        slot size when vLLM reports none) and durations (since submission when vLLM
        reports none) summed per direction; failed jobs (vLLM 0.34's worker reports them)
        leave the in-flight count and are counted apart."""
        self.active = self.pending = True
        stores, loads, sizes, seconds_of, failed, now = (
            self.stores, self.loads, self._bytes, self._seconds, self._failed, None)
        with self._lock:
            for res in results:
                job_id = res.job_id
                job = stores.pop(job_id, None)
                if job is not None:
                    d = STORE
                else:
                    job = loads.pop(job_id, None)
                    if job is None:
                        continue
                    d = LOAD
                if not res.success:
                    failed[d] += 1
                    continue
                size = res.transfer_size
                if size is None and slot_size is not None:
                    size = job[1] * slot_size
                seconds = res.transfer_time
                if seconds is None:
                    if now is None:
                        now = _monotonic()
                    seconds = now - job[0]
                sizes[d] += size or 0
                seconds_of[d].append(seconds)
                if on_transfer is not None:
                    on_transfer(job_id, _DIRECTIONS[d], size, seconds)

    def push(self) -> None:
        """Everything tallied since the last push into the recorder, then its flush."""
        rec = self._rec
        with self._lock:
            self.pending = False
            for d in (STORE, LOAD):
                if self._failed[d]:
                    rec.inc(signals.TRANSFERS_FAILED, self._labels[d], self._failed[d])
                    self._failed[d] = 0
                seconds = self._seconds[d]
                if seconds:
                    labels = self._labels[d]
                    self._seconds[d] = []
                    size, self._bytes[d] = self._bytes[d], 0
                    rec.inc(signals.TRANSFER_BYTES, labels, size)
                    rec.observe_many(signals.TRANSFER_SECONDS, labels, seconds)
            shown = self._shown
            for d, n in ((STORE, len(self.stores)), (LOAD, len(self.loads))):
                if shown[d] != n:
                    shown[d] = n
                    rec.set(signals.TRANSFERS_IN_FLIGHT, self._labels[d], n)
            rec.flush()
