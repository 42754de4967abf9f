"""Scheduler side: a thin coordinator over one-job rooms.

Nothing here changes what vLLM decides. The manager proxy and the taps forward every
call unchanged and record what passed through; every recording is guarded so
that an exception in kvscope is counted (``kvscope_telemetry_errors_total``)
and never reaches vLLM. The rooms:

* ``manager_proxy``: the OffloadingManager's stand-in: lookup, load and store taps;
* ``lookup.rounds``: raw lookup events in slots handed over as each round ends;
* ``prefix_scan``: those lookups read from vLLM's prefix scan where it tells them all;
* ``aggregator``: its own daemon thread: the journal of raw facts the scheduler thread
  appends, applied in order every ``flush_interval_s`` (default 1 s: rounds judged,
  request states, store jobs),
  then the flush into the recorder, the gauges and vLLM's stats object;
* ``round_verdicts``: verdict, row ceiling, restore coverage per round (its span:
  ``round_spans``);
* ``tiers.taps``: promotions, cascades and refused promotions per tier job;
* ``group_stores``: store jobs' keys per KV group, the primary tier's keys per group;
* ``integrity.promoted_rows``: promoted-row digests, checked loads, quarantine;
* ``request_states``: queued / deferred / loading / running, counted incrementally;
* ``step_gauges``: snapshot gauges (vLLM's GPU block pool and the host's memory among them)
  and the info gauges;
* ``tiers.probe``: its own daemon thread: recently written tier data still there?

On vLLM's scheduler thread kvscope only records: the round's lookups (list appends per key
looked up, or a few list extends per prefix scan: ``prefix_scan``), one journal event per
round, request event, store job and step. Everything else holds the aggregator's lock
(``self.agg.lock``) and runs on the aggregator thread, or on the caller's thread for a
synchronous drain (:meth:`SchedulerObserver.refresh`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import Tracer

from kvscope.connector import compat, contained_faults
from kvscope.connector.aggregator import INTERVAL_S, Aggregator
from kvscope.connector.export.step_gauges import StepGauges
from kvscope.connector.integrity.checksums import ChecksumPolicy, Digester
from kvscope.connector.integrity.promoted_rows import PromotedRows
from kvscope.connector.integrity.shared_region import ChecksumScope, SharedRanks
from kvscope.connector.lookup import prefix_scan
from kvscope.connector.lookup.coverage import group_suffixes
from kvscope.connector.lookup.manager_proxy import ManagerProxy
from kvscope.connector.lookup.request_states import RequestStates
from kvscope.connector.lookup.round_verdicts import RoundVerdicts, offload_of
from kvscope.connector.lookup.rounds import LookupCounts, LookupLog
from kvscope.connector.lookup.scan_cache import DeferredScans
from kvscope.connector.tiers.group_stores import GroupStores
from kvscope.connector.tiers.probe import DEFAULT_INTERVAL_S, TierProbe
from kvscope.connector.tiers.store_refusals import RefusedStores
from kvscope.connector.tiers.taps import TierTaps
from kvscope.exporters import signals
from kvscope.exporters.otel import tracing_enabled
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import ErrorSite, LookupResult, StoreJobResult, VllmFault

# Freshness gauges move at most this often: alerts compare them with minutes,
# and an unchanged gauge costs nothing on vLLM's per-step stats path.
TIMESTAMP_RESOLUTION_S = 1.0
# While busy, counters, histograms and gauges reach the recorder (vLLM's stats path)
# this often by default, from the aggregator thread (kvscope's flush_interval_s setting);
# a scrape or a read drains at once.
FLUSH_INTERVAL_S = INTERVAL_S
_NO_SPACE = (StoreJobResult.NO_SPACE.value,)
_PREPARED = (StoreJobResult.PREPARED.value,)


class SchedulerObserver:
    """All scheduler-side state kvscope keeps; one per connector instance."""

    def __init__(self, *, recorder: Recorder, tracer: Tracer, connector_scheduler: Any,
                 spec: Any, vllm_config: Any, kv_cache_config: Any,
                 checksum_policy: str = ChecksumPolicy.REFUSE,
                 tier_probe_interval_s: float = DEFAULT_INTERVAL_S,
                 digester: Digester | None = None,
                 stats_builder: Callable[[Any], Any] | None = None,
                 flush_interval_s: float = FLUSH_INTERVAL_S,
                 per_key_lookups: bool = False,
                 contain_vllm_faults: bool = True,
                 checksum_scope: str = ChecksumScope.UNSHARED) -> None:
        """``per_key_lookups``: record each key looked up even where the prefix scan's
        answer tells the lookups (prefix_scan.py; the setting of the same name)."""
        self.rec = recorder
        self.tracer = tracer
        self.cs = connector_scheduler
        self.spec = spec
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.checksum_policy = checksum_policy
        inner = connector_scheduler.manager
        if isinstance(inner, ManagerProxy):
            inner = inner._inner
        self.geometry = compat.region_geometry(spec)
        tiered = bool(compat.secondary_tiers(inner))
        lookup_groups = compat.lookup_groups(connector_scheduler)
        self.log = LookupLog()
        self.lookups = LookupCounts(group_suffixes(lookup_groups)[0][0]
                                    if len(lookup_groups) == 1 else None)
        self.rows = PromotedRows(recorder=recorder, policy=checksum_policy,
                                 view=compat.scheduler_view(inner) if tiered else None,
                                 geometry=self.geometry, digester=digester,
                                 ranks=SharedRanks(compat.scheduler_region(inner),
                                                   self.geometry.world_size, checksum_scope)
                                 if tiered and self.geometry is not None else None)
        per_chunk = compat.blocks_per_chunk(spec)
        self.requests = RequestStates([t * per_chunk for t in compat.group_tokens_per_block(spec)
                                       if t])
        self.agg = Aggregator(recorder=recorder, refresh=self.refresh,
                              interval_s=flush_interval_s, quiet=self.quiet)
        self.journal = self.agg.journal
        self.taps = TierTaps(recorder=recorder, tracer=tracer, manager=inner, log=self.log,
                             rows=self.rows,
                             row_bytes=self.geometry.row_stride if self.geometry else 0,
                             journal=self.journal)
        # The CPU tier alone drops what it evicts: a refusal stops explaining a miss once
        # the tier has cycled through its rows since.
        self.refused_stores = RefusedStores(
            forget_after=None if tiered else compat.row_states(self.taps.primary)[0])
        self.verdicts = RoundVerdicts(recorder=recorder, tracer=tracer,
                                      connector_scheduler=connector_scheduler,
                                      primary=self.taps.primary, requests=self.requests,
                                      refused_stores=self.refused_stores,
                                      count_lookups=self.lookups.add,
                                      count_counted=self.lookups.add_counted)
        self._judge_plain = self.verdicts.judge_plain  # a plain round's journal handler
        self._judge_counted = self.verdicts.judge_counted  # one KV group's (counted)
        self.group_stores = GroupStores(
            recorder=recorder, manager=inner,
            chunk_tokens=compat.group_chunk_tokens(connector_scheduler),
            row_bytes=self.geometry.row_stride if self.geometry else 0)
        self.gauges = StepGauges(recorder=recorder, connector_scheduler=connector_scheduler,
                                 taps=self.taps, requests=self.requests, rows=self.rows,
                                 spec=spec, vllm_config=vllm_config,
                                 kv_cache_config=kv_cache_config,
                                 checksum_policy=checksum_policy)
        self.primary, self.tiers = self.taps.primary, self.taps.tiers
        # vLLM's stats objects the aggregator prepared (stats_builder(delta)), each handed
        # over whole by the scheduler thread (take_stats): popleft/append are atomic
        self.ready_stats: deque[Any] = deque()
        self._stats_builder = stats_builder
        self._stamped = 0.0
        self._flushed_at = 0.0  # monotonic time of the last refresh()
        self._steps = 0  # steps since then (aggregator side)
        # Requests vLLM told the connector of (on_new_request) and did not finish
        # (request_finished), kept by the hooks (scheduler thread). While any lives, vLLM
        # steps again (it has requests), so a step that schedules nothing waits for them
        # (a lookup deferred by a tier, a load in flight, async scheduling's outputs in
        # flight, capacity): not the idle state. None: those hooks are not all installed
        # (a further subclass overrides one), and every empty step counts as idle.
        self._live: set[str] | None = set()
        # vLLM's own per-request states (compat.request_statuses): the truth the live set is
        # reconciled with on an empty step (_forget_gone)
        self._vllm_requests = compat.request_statuses(connector_scheduler)
        # journal handlers bound once (a bound method per event is an allocation)
        self._step_handler, self._store_job_handler = self._step, self._store_job
        self._on_new = self.requests.on_new
        self._after_alloc = self.requests.after_alloc
        self._on_finished = self.requests.on_finished
        self._store_jobs = [0, 0]  # no_space, prepared since then (aggregator side)
        self.contained = False  # a vLLM fault contained on this release (contained_faults.py)
        if not getattr(connector_scheduler.manager, compat.WRAPPED_MARK, False):
            # vLLM's CPU manager alone: the scan's answer and the tier's policy; with a
            # secondary tier: the scan's answer and the tiers' state (prefix_scan.py)
            result_of = read = None
            if not per_key_lookups:
                result_of = compat.scan_reader(connector_scheduler, inner)
                if result_of is None:
                    read = compat.tiered_scan_reader(connector_scheduler, inner)
            if result_of is not None:
                prefix_scan.install(connector_scheduler, self.log, result_of, recorder.error)
            # its taps bind the above
            proxy = ManagerProxy(inner, log=self.log, rows=self.rows,
                                 journal_extend=self.journal.extend,
                                 store_job=self._store_job_handler, error=recorder.error,
                                 per_key_lookups=result_of is None and read is None)
            connector_scheduler.manager = proxy
            # vLLM bugs that raise out of its step, answered quietly (contained_faults.py)
            self.contained = contained_faults.install(proxy, inner, recorder,
                                                      contain_vllm_faults)
            if read is not None:
                # a request's deferred scans counted per change (scan_cache.py), where
                # the tier taps log every primary call that changes rows
                scans = (DeferredScans(self.taps.changes, read.places)
                         if self.taps.changes_logged else None)
                prefix_scan.install_tiered(connector_scheduler, self.log, read,
                                           self.taps.cursor, self.rows.quarantine,
                                           proxy.per_key_switches(), recorder.error, scans,
                                           proxy.direct_for(connector_scheduler),
                                           self.taps.bare if read.bare_ok else None)
        self.lookups_from_scan = getattr(getattr(connector_scheduler, compat.SCAN_METHOD,
                                                 None), compat.WRAPPED_MARK, False)
        self._live_jobs = lambda: {jid for jid, _ in compat.connector_jobs(self.cs)}
        # vLLM's GPU block pool once the scheduler binds it (bind_block_pool): the reader of
        # its blocks in use, and what the latest settled step left in use (settle)
        self._blocks_in_use: Callable[[], int] | None = None
        self._settled_blocks = 0
        # the last live request finished: the step's end settles the gauges (settle)
        self.settle_due = False
        self._job_map = compat.connector_job_map(connector_scheduler)
        self._set_tracing(tracing_enabled(tracer))
        self._step_guard = recorder.guard(ErrorSite.STEP)
        self._stats_guard = recorder.guard(ErrorSite.STATS)
        self._lookup_guard = recorder.guard(ErrorSite.LOOKUP)
        self._round_guard = recorder.guard(ErrorSite.ROUND)
        self._tier_guard = recorder.guard(ErrorSite.TIER)
        self._offload_prefix = compat.offload_prefix_capture(connector_scheduler)
        self._declare_series()
        self.agg.hold_back.busy = self.taps.reading
        self.probe = TierProbe(recorder=recorder, tiers=self.tiers, written=self.taps.written,
                               interval_s=tier_probe_interval_s, busy=self.taps.busy).start()
        recorder.before_read = self.drain  # a reader sees every event recorded before
        # The gauges once now, as the engine is built: their first refresh's one-off work
        # (the static info, the host's first sample) is then no serving step's (the first
        # settle's, after a burst shorter than flush_interval_s), and they read from the start
        try:
            self.refresh()
        except Exception as exc:
            self.rec.error(ErrorSite.STEP, exc)
        self.agg.start()
        self.group_stores.owner = self.agg.thread  # it may yield the GIL while counting

    def _set_tracing(self, on: bool) -> None:
        # read once per round by the connector's hook (scheduler/hooks.py)
        self._tracing = self.taps.tracing = self.verdicts.tracing = on

    def _declare_series(self) -> None:
        rec, one = self.rec, lambda enum: [(v.value,) for v in enum]
        groups = range(len(compat.kv_group_kinds(self.kv_cache_config)) or 1)
        rec.declare(signals.LOOKUPS, *[(str(g), r.value) for g in groups for r in LookupResult])
        self.verdicts.declare()
        rec.declare(signals.STORE_JOBS, *one(StoreJobResult))
        self.group_stores.declare()
        rec.declare(signals.TELEMETRY_ERRORS, *one(ErrorSite))
        rec.declare(signals.SCHEDULER_STEPS)
        rec.declare(signals.VLLM_FAULTS_CONTAINED, *one(VllmFault))
        self.taps.declare()

    # ---- manager calls (the proxy's prepare_store: manager_proxy._store_tap) ----------------
    def _store_job(self, evicted: tuple[bytes, ...] | None, stored: tuple[bytes, ...],
                   keys: tuple[bytes, ...]) -> None:
        """Aggregator: a store job of ``keys`` prepared (``evicted``: the keys whose rows it
        took; ``stored``: the keys it writes, the rest were held) or refused (``evicted``
        None)."""
        if evicted is None:
            self._store_jobs[0] += 1
            self.refused_stores.refused(keys)  # told apart from not_stored at the re-ask
            self.group_stores.refused(keys)
            return
        self.refused_stores.prepared(keys, len(evicted))
        self.group_stores.prepared(keys, stored, evicted)
        if stored:
            self._store_jobs[1] += 1

    # ---- lookup rounds (one get_num_new_matched_tokens call each) ---------------------------
    # A plain round (no rare event, no span: most rounds) is handed over by the connector's
    # hook itself (scheduler/hooks.py): its lookups summarized, the request's token count and
    # offload-key lengths captured, in one journal event for the aggregator thread.
    def traced_round(self, ask: Callable[[Any, int], Any], request: Any,
                     num_computed: int) -> Any:
        """One lookup round while spans are on (``ask``: vLLM's lookup of the request):
        the round's span starts now."""
        self.log.begin(time.time_ns())
        started = time.perf_counter()
        result = ask(request, num_computed)
        self.end_round(request, result[0], num_computed, started, time.perf_counter() - started)
        return result

    def end_round(self, request: Any, num_tokens: int | None, num_computed: int = 0,
                  started: float = 0.0, took: float = 0.0) -> None:
        """Scheduler thread: a round with a rare event (a quarantined key, a refused
        promotion, an eviction) or a span, judged now, after a synchronous drain.
        A deferred round (``num_tokens`` None) captures no offload keys: coverage judges
        only rounds that ended."""
        log = self.log
        try:
            rid = request.request_id
            with self.agg.lock:
                self.agg.drain()  # the rounds and store jobs before this one first
                rnd, keys, results = log.end()
                self.lookups.add(self.lookups.tally(keys, results))
                self.requests.clock.on_round(rid, num_tokens, started, took, len(results),
                                             rows_short=bool(rnd is not None and rnd.refusals))
                if rnd is not None:
                    self.verdicts.record(rnd, rid, request.num_tokens,
                                         offload_of(*self._offload_prefix(rid)), num_tokens,
                                         num_computed)
        except Exception as exc:
            self.rec.error(ErrorSite.ROUND, exc)

    def close(self) -> None:
        """Stop the threads (after a last drain); drop buffer exports so vLLM can close
        the primary tier's mmap."""
        self.agg.close()
        self.refresh()
        self.probe.close()
        self.rows.close()

    # ---- checked loads ---------------------------------------------------------------------
    def on_connector_output(self, output: Any) -> None:
        self.rows.on_connector_output(output, self._live_jobs)

    # ---- settled at idle: vLLM's GPU block pool ----------------------------------------------
    def bind_block_pool(self, pool: Any) -> None:
        """vLLM's scheduler hands its connector the GPU block pool once it exists (the
        connector's ``bind_gpu_block_pool``: ``compat.block_pool``). The gauges read it from
        then on, and the end of every step that leaves the engine settled (:meth:`settle`)."""
        got = compat.gpu_blocks_in_use(pool)
        if got is None:
            return
        total, in_use = got
        with self.agg.lock:
            self.gauges.bind_block_pool(total, in_use)
            self._blocks_in_use = in_use
            self._settled_blocks = in_use()
            self.rec.set(signals.IDLE_GPU_BLOCKS, (), self._settled_blocks)

    def settle(self) -> None:
        """Scheduler thread, the end of a step (vLLM's stats hook, after it freed what the
        step finished) that left no request known to the connector. The step that finished
        the last one (:attr:`settle_due`, set by the finish hook) is aggregated at once, the
        gauges with it, and handed to vLLM's stats path in this very hook: vLLM may never
        step again (its engine core does not once it holds no request; an in-process
        ``LLM.generate`` returns after that step), so what this step leaves is the settled
        state, the request gauges at 0. Unless a load or store job is in flight, the blocks
        vLLM's pool still holds are held by no request (``kvscope_idle_gpu_blocks_in_use``;
        0 on a healthy engine), aggregated the same way when it changed. O(1) otherwise."""
        due, self.settle_due = self.settle_due, False
        try:
            in_use = self._blocks_in_use
            if in_use is not None and not self._job_map:
                n = in_use()
                if n != self._settled_blocks:
                    self._settled_blocks = n
                    self.rec.set(signals.IDLE_GPU_BLOCKS, (), n)
                    due = True
            if due:
                self.refresh(hand_over=True)
        except Exception as exc:
            self.rec.error(ErrorSite.STEP, exc)

    def quiet(self) -> None:
        """Aggregator thread, a wake-up with no event (the engine idles, or waits): the
        host's memory sampled when due (host_memory.py), so that it is watched at idle too.
        A scrape of the standalone endpoint reads it at once; vLLM's /metrics with the next
        stats object kvscope hands vLLM (its next step)."""
        host = self.gauges.host
        if not host.due():
            return
        with self.agg.lock, self._step_guard:
            values = host.sample()
            if values:
                self.rec.set_many(values)

    # ---- once per step ---------------------------------------------------------------------
    def on_step(self, scheduler_output: Any) -> None:
        """Scheduler thread: the step's scheduled and preempted ids into the journal. An
        idle step (nothing scheduled and no request left: the state an operator inspects
        afterwards, such as stores still pending), or a journal the aggregator thread let
        grow past its limit, is aggregated at once; one past the aggregator's wake bound
        wakes that thread (``Aggregator.behind``). A step that scheduled nothing while
        requests live (a lookup deferred by a tier's existence checks, a load in flight,
        async scheduling's outputs in flight) is not idle: vLLM steps again, and the
        aggregator thread applies it, as any busy step (synchronously if that thread is
        not running)."""
        try:  # guarded as every hook (a plain try: no context-manager frames per step)
            scheduled = scheduler_output.num_scheduled_tokens
            preempted = getattr(scheduler_output, "preempted_req_ids", None) or None
            # the ids themselves, not vLLM's per-step dict (aggregator.py: why flat)
            self.journal.extend([self._step_handler, 2 + len(scheduled), time.perf_counter(),
                                 preempted, *scheduled])
            if not scheduled and self._live and self._vllm_requests is not None:
                self._forget_gone(self._live, self._vllm_requests)
            agg = self.agg
            if (not scheduled and not (self._live and agg.alive())) \
                    or (len(self.journal) > agg.wake_at and agg.behind()):
                self.refresh()
        except Exception as exc:
            self.rec.error(ErrorSite.STEP, exc)

    def _forget_gone(self, live: set[str], statuses: Any) -> None:
        """Scheduler thread, an empty step while kvscope counts requests live: those vLLM's
        connector no longer holds ended, and their end was lost to an error of kvscope's
        (counted then). They leave now, here and in the request states, so that one lost
        event does not keep every later idle step from reading as idle, nor a request
        state counted, after the error has left kv-diagnose's window. O(live), a few times
        per busy iteration at most (the steps that schedule nothing)."""
        gone = [rid for rid in live if rid not in statuses]
        if gone:
            live.difference_update(gone)
            on_finished, extend = self._on_finished, self.journal.extend
            for rid in gone:
                extend((on_finished, 1, rid))

    def _step(self, at: float, preempted: Any, *scheduled: str) -> None:
        """Aggregator: a step (stamped ``at``, perf_counter) ended."""
        self.requests.on_step(scheduled, preempted, at)
        self._steps += 1

    def take_stats(self) -> Any:
        """Scheduler thread (vLLM's stats hook): the stats object the aggregator prepared
        since the last call, or None. O(1) but for several waiting (merged here)."""
        ready = self.ready_stats
        if not ready:
            return None
        ours = ready.popleft()
        while ready:
            ours = ours.aggregate(ready.popleft())
        return ours

    def _flush_rooms(self) -> None:
        """The lookups and round sums since the last flush into the recorder."""
        with self._lookup_guard:
            self.lookups.flush(self.rec)
        with self._round_guard:
            self.verdicts.flush()
            self.requests.clock.flush(self.rec)
        no_space, prepared = self._store_jobs
        if no_space or prepared:
            self._store_jobs = [0, 0]
            for labels, n in ((_NO_SPACE, no_space), (_PREPARED, prepared)):
                if n:
                    self.rec.inc(signals.STORE_JOBS, labels, n)
        with self._tier_guard:
            self.taps.flush()
        with self._tier_guard:
            self.group_stores.flush()

    def refresh(self, gauges: bool = True, hand_over: bool = False) -> None:
        """Apply the journal, recompute the gauges and flush everything now: the
        aggregator thread every flush_interval_s while events arrive; synchronously an
        idle step, shutdown, a harness, a test. ``gauges=False`` (a reader of the
        recorder: :meth:`drain`): the snapshot gauges keep their step cadence.
        ``hand_over``: a stats object for vLLM even if one already waits (:meth:`settle`:
        vLLM may take none after this one)."""
        rec, agg = self.rec, self.agg
        with agg.lock:
            self._flushed_at = time.monotonic()
            if not gauges and agg.journal:  # gauges left behind the events: the next wake-up
                agg.gauges_due = True
            agg.drain()
            self._flush_rooms()
            with self._step_guard:
                if self._steps:
                    rec.inc(signals.SCHEDULER_STEPS, (), self._steps)
                    self._steps = 0
                if gauges:
                    agg.gauges_due = False
                    self.gauges.refresh()
                    self.group_stores.refresh_gauges()
                    now = time.time()
                    if now - self._stamped >= TIMESTAMP_RESOLUTION_S:  # seconds suffice
                        self._stamped = now
                        rec.set(signals.LAST_STEP_TIMESTAMP, (), now)
                        self._set_tracing(tracing_enabled(self.tracer))  # a provider may appear
            with self._stats_guard:
                rec.flush()
                # vLLM's stats object built here, handed over whole by take_stats; a new
                # one only once the last was taken (the recorder's delta is bounded)
                if self._stats_builder is not None and rec.delta_ready \
                        and (hand_over or not self.ready_stats):
                    stats = self._stats_builder(rec.take_delta())
                    if stats is not None:
                        self.ready_stats.append(stats)

    def drain(self) -> None:
        """Every event recorded so far into the recorder's counters and histograms (a
        scrape, a test reading a value: ``Recorder.before_read``)."""
        self.refresh(gauges=False)
