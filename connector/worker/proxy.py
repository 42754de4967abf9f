"""Worker-side instrumentation: per-rank bytes, in-flight transfers, row checksums.

:class:`WorkerProxy` stands in for the OffloadingWorker one rank's connector
worker submits to. Stores and loads are forwarded unchanged and timed. A load
whose source rows carry expected digests (rows a promotion filled on the
scheduler host) is first checked against this rank's own mapping of those rows:

* policy ``observe``: mismatches are counted, the load is served;
* policy ``refuse`` (default): the load is not submitted. The job is reported
  finished (vLLM's offloading worker does not support failed jobs) and vLLM's
  ``kv_load_failure_policy`` applies (``recompute`` recomputes those tokens,
  ``fail`` fails the request): its GPU blocks go through
  ``get_block_ids_with_load_errors`` (one KV group), or, on vLLM 0.33 with
  several groups, its request through ``failed_recving``; on vLLM 0.34 the job is
  reported failed and vLLM fails its request the same way (``compat.load_failures``).
  Never wrong tokens. Transfers vLLM's own worker reports failed (0.34) are counted
  per rank and direction.

Fail-open for observability, fail-closed for correctness: an exception in the
telemetry is counted and swallowed; a rank that cannot read its own slot
refuses the load (``reason="checksum_error"``) under ``refuse``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry.trace import Tracer

from kvscope.connector import compat
from kvscope.connector.compat import load_failures
from kvscope.connector.compat.device_pointers import gpu_block_count
from kvscope.connector.integrity.checksums import DEFAULT_ALGORITHM, ChecksumPolicy, Digester
from kvscope.connector.integrity.promoted_rows import mismatched_rows
from kvscope.connector.integrity.shared_region import remove_marker, write_marker
from kvscope.connector.scheduler.observer import FLUSH_INTERVAL_S, TIMESTAMP_RESOLUTION_S
from kvscope.connector.worker.tally import TransferTally
from kvscope.exporters import signals
from kvscope.exporters.otel import tracing_enabled
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import ChecksumOutcome, Direction, ErrorSite, RefusalReason

logger = logging.getLogger("kvscope")


class WorkerProxy:
    def __init__(self, inner: Any, *, recorder: Recorder, tracer: Tracer, spec: Any,
                 checksum_policy: str = ChecksumPolicy.REFUSE,
                 algorithm: str = DEFAULT_ALGORITHM,
                 digest_threads: int | None = None,
                 refusal_path: str | None = load_failures.BLOCKS,
                 flush_interval_s: float = FLUSH_INTERVAL_S) -> None:
        self._inner = inner
        self._refusal_path = refusal_path
        self._rec = recorder
        self._tracer = tracer
        self._policy = checksum_policy
        self._digester = Digester(algorithm, digest_threads)
        self._geometry = compat.region_geometry(spec)
        self._region = compat.worker_region(inner)
        rank = compat.region_rank(self._region)
        self.rank = rank if rank is not None else compat.process_rank()
        self._rank_label = str(self.rank)
        # Next to the file this rank mapped: the scheduler reads it where it is its own file
        # and then digests no promoted row for this rank (shared_region.py).
        self._marker = None
        if checksum_policy != ChecksumPolicy.OFF and self._region is not None:
            try:
                self._marker = write_marker(self._region, self.rank)
            except OSError as exc:  # digests stay on for this rank: nothing is lost
                logger.warning("kvscope: rank %s could not mark its region file (%s); its "
                               "promoted rows stay digested", self.rank, exc)
        # in flight and finished, into the recorder at most every flush_interval_s (kvscope's
        # setting) while transfers keep coming, at once on a quiet step or for a reader
        # (worker/tally.py)
        self.flush_interval_s = flush_interval_s
        self._tally = tally = TransferTally(recorder, self._rank_label)
        self._start_store, self._start_load = tally.start_store, tally.start_load  # per job
        self._flushed_at = float("-inf")
        self._recorded = False  # recorded outside the tally since the last flush
        recorder.before_read = self.drain
        self._refused: dict[int, list[int]] = {}  # job id -> GPU block ids to recompute
        # GPU blocks of refused loads not yet taken (a plain attribute: the connector reads it
        # every step)
        self.load_errors: set[int] = set()
        self._load_requests: dict[int, str] = {}  # job id -> request id (this step's loads)
        self._failed_requests: set[str] = set()
        self._stamped = float("-inf")  # monotonic time of the last step timestamp set
        self._tracing = tracing_enabled(tracer)
        self._slot_size = self._geometry.slot_size if self._geometry is not None else None
        # read by the connector once per step (start_load_kv): request-level refusals only
        self.wants_load_jobs = refusal_path in (load_failures.REQUESTS, load_failures.JOBS)
        setattr(self, compat.WRAPPED_MARK, True)
        r = self._rank_label
        recorder.declare(signals.TRANSFER_BYTES, (r, Direction.GPU_TO_CPU.value),
                         (r, Direction.CPU_TO_GPU.value))
        recorder.declare(signals.ROW_CHECKSUMS, *[(r, o.value) for o in ChecksumOutcome])
        recorder.declare(signals.LOADS_REFUSED, *[(r, x.value) for x in RefusalReason])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    # ---- OffloadingWorker interface ----------------------------------------------
    # The submissions are per job (~1,500 per GPU iteration): the tally inline, no helper frame
    def submit_store(self, job_id, src_spec, dst_spec, *args, **kwargs):
        try:
            self._start_store(job_id, gpu_block_count(src_spec))
        except Exception as exc:
            self._telemetry_error(exc)
        return self._inner.submit_store(job_id, src_spec, dst_spec, *args, **kwargs)

    def submit_load(self, job_id, src_spec, dst_spec, *args, **kwargs):
        if self._policy != ChecksumPolicy.OFF and not self._verify(src_spec):
            if self._policy == ChecksumPolicy.REFUSE and self._can_refuse(job_id):
                self._refused[job_id] = (compat.spec_rows(dst_spec)
                                         if self._refusal_path == load_failures.BLOCKS else [])
                self._tally.active = True
                return True
        try:
            self._start_load(job_id, gpu_block_count(dst_spec))
        except Exception as exc:
            self._telemetry_error(exc)
        return self._inner.submit_load(job_id, src_spec, dst_spec, *args, **kwargs)

    def get_finished(self):
        results = list(self._inner.get_finished())
        if results:
            try:
                self._tally.finish(results, self._slot_size,
                                   self._span if self._tracing else None)
            except Exception as exc:
                self._telemetry_error(exc)
        if self._refused:  # correctness path: outside any telemetry guard
            from kvscope.connector.compat.vllm_api import TransferResult

            for job_id, blocks in self._refused.items():
                if self._refusal_path == load_failures.JOBS:  # vLLM fails the request
                    results.append(TransferResult(job_id=job_id, success=False))
                    continue
                results.append(TransferResult(job_id=job_id, success=True))
                if self._refusal_path == load_failures.REQUESTS:
                    self._failed_requests.add(self._load_requests[job_id])
                else:
                    self.load_errors.update(blocks)
            self._refused.clear()
        return results

    def _span(self, job_id: int, direction: Direction, size: int | None, seconds: float) -> None:
        with self._tracer.start_as_current_span(signals.SPAN_TRANSFER) as span:
            span.set_attribute(signals.A_RANK, self.rank)
            span.set_attribute(signals.A_DIRECTION, direction.value)
            span.set_attribute(signals.A_BYTES, int(size or 0))
            span.set_attribute(signals.A_JOB_ID, int(job_id))
            span.set_attribute(signals.A_DURATION_S, float(seconds))

    def wait(self, job_ids, *args, **kwargs):
        return self._inner.wait({j for j in job_ids if j not in self._refused}, *args, **kwargs)

    def shutdown(self):
        self._digester.close()
        remove_marker(self._marker)
        self._marker = None
        return self._inner.shutdown()

    # ---- kvscope ------------------------------------------------------------------------
    def note_load_jobs(self, load_jobs: dict | None) -> None:
        """Remember which request each of this step's asynchronous load jobs serves."""
        with self._rec.guard(ErrorSite.WORKER):
            self._load_requests = {
                job_id: load_failures.load_job_request(job)
                for job_id, job in (load_jobs or {}).items()
                if not getattr(job, "sync", False)}

    def _can_refuse(self, job_id: int) -> bool:
        """Whether vLLM can recompute this load if refused. Request-level reports
        (0.33, several groups) and failed jobs (0.34) need an asynchronous load."""
        if self._refusal_path in (load_failures.REQUESTS, load_failures.JOBS):
            return self._load_requests.get(job_id) is not None
        return self._refusal_path is not None

    def take_failed_requests(self) -> set[str]:
        failed, self._failed_requests = self._failed_requests, set()
        return failed

    def take_load_errors(self) -> set[int]:
        errors, self.load_errors = self.load_errors, set()
        return errors

    def step(self) -> None:
        """Once per step (the connector's get_finished): the tally into the recorder every
        :attr:`flush_interval_s`, and at once on a quiet step (nothing submitted or finished:
        the engine idles or waits) if anything is left; vLLM's stats hook hands over what was
        flushed, so a rank's series reach vLLM up to flush_interval_s (default 1 s) and one
        step after the fact."""
        tally = self._tally
        quiet, tally.active = not tally.active, False
        now = time.monotonic()  # one clock read per step; the wall clock once a second
        if now - self._stamped >= TIMESTAMP_RESOLUTION_S:
            self._stamped = now
            self._recorded = True
            with self._rec.guard(ErrorSite.WORKER):
                self._rec.set(signals.WORKER_LAST_STEP_TIMESTAMP, (self._rank_label,),
                              time.time())
                self._tracing = tracing_enabled(self._tracer)
        if (now - self._flushed_at >= self.flush_interval_s
                or quiet and (tally.pending or self._recorded)):
            self._flushed_at, self._recorded = now, False
            self.drain()

    def drain(self) -> None:
        """The tally and everything recorded into the recorder's flushed state now (also
        ``Recorder.before_read``: a reader, on its own thread, sees every transfer)."""
        with self._rec.guard(ErrorSite.STATS):
            self._tally.push()

    def _telemetry_error(self, exc: BaseException) -> None:
        self._rec.error(ErrorSite.WORKER, exc)
        self._recorded = True

    def _verify(self, src_spec: Any) -> bool:
        """Compare this rank's slot of promoted rows with the scheduler's digests.

        True when nothing is to be checked or every row matches.
        """
        expected = getattr(src_spec, compat.EXPECTED_DIGESTS_ATTR, None)
        if not expected:
            return True
        self._recorded = True  # the outcome is counted below, whatever it is
        g, buf = self._geometry, compat.region_buffer(self._region)
        try:
            if g is None or buf is None:
                raise RuntimeError("no shared region mapped on this rank")
            view = memoryview(buf)
            try:
                compared, mismatched = mismatched_rows(view, g, self.rank, expected,
                                                       self._digester)
            finally:
                view.release()
        except Exception as exc:
            self._rec.error(ErrorSite.CHECKSUM, exc)
            if self._policy != ChecksumPolicy.REFUSE:
                return True
            self._rec.inc(signals.LOADS_REFUSED,
                          (self._rank_label, RefusalReason.CHECKSUM_ERROR.value))
            return False
        matched = compared - mismatched
        if matched:
            self._rec.inc(signals.ROW_CHECKSUMS, (self._rank_label, ChecksumOutcome.MATCH.value),
                          matched)
        if mismatched:
            self._rec.inc(signals.ROW_CHECKSUMS,
                          (self._rank_label, ChecksumOutcome.MISMATCH.value), mismatched)
            if self._policy == ChecksumPolicy.REFUSE:
                self._rec.inc(signals.LOADS_REFUSED,
                              (self._rank_label, RefusalReason.CHECKSUM_MISMATCH.value))
            return False
        return True
