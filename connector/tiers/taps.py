"""Taps on the tier instances of a tiering manager: promotions, cascades, refusals.

Instance-attribute shadowing: each tap forwards the call unchanged and records
what passed through (per tier job, never per key looked up). Promotions are
secondary -> primary tier jobs, cascades primary -> secondary; a promotion the
primary tier refuses for want of a free row is handed to the lookup log (it
decides why the round's scan stopped) and counted.
"""

from __future__ import annotations

import time
from collections import deque
from operator import attrgetter
from typing import Any

from opentelemetry.trace import Tracer

from kvscope.connector import compat
from kvscope.connector.integrity.promoted_rows import PromotedRows
from kvscope.connector.lookup.prefix_scan import ScanCursor
from kvscope.connector.lookup.rounds import LookupLog
from kvscope.connector.lookup.scan_cache import PrimaryChanges
from kvscope.connector.tiers.probe import QUIET_S, WRITTEN_JOBS
from kvscope.exporters import signals
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import CascadeResult, Direction, ErrorSite, PromotionResult

_STARTED = (PromotionResult.STARTED.value,)
_NO_ROW = (PromotionResult.NO_ROW.value,)
_CASCADE_STARTED = (CascadeResult.STARTED.value,)
_CASCADE_COMPLETED = (CascadeResult.COMPLETED.value,)
_CASCADE_FAILED = (CascadeResult.FAILED.value,)
_DISK_TO_CPU = (signals.RANK_MANAGER, Direction.DISK_TO_CPU.value)
_CPU_TO_DISK = (signals.RANK_MANAGER, Direction.CPU_TO_DISK.value)


def _nothing() -> None:
    """A journal event that only wakes the aggregator (its refresh reads the gauges)."""


class TierJob:
    """A submitted tier job; its rows and keys are decoded when it completes."""

    __slots__ = ("started", "job", "tier")

    def __init__(self, started: float, job: Any, tier: str) -> None:
        self.started = started
        self.job = job
        self.tier = tier


class TierTaps:
    def __init__(self, *, recorder: Recorder, tracer: Tracer, manager: Any, log: LookupLog,
                 rows: PromotedRows, row_bytes: int, journal: list | None = None) -> None:
        self.rec = recorder
        # The aggregator's journal (aggregator.py): a cascade's start and end are appended
        # there on vLLM's thread and summed on the aggregator's (_cascade_*; flush())
        self.journal: list = journal if journal is not None else []
        self.tracer = tracer
        self.tracing = False  # set by the coordinator (re-checked periodically)
        self.log = log
        self.rows = rows
        self.row_bytes = row_bytes
        # Open while a tapped tiering scan runs (prefix_scan.tiered_scan_tap): what each
        # promotion did is also noted there, at the lookup in progress
        self.cursor = ScanCursor()
        # The keys whose primary rows each call of the primary tier changed (scan_cache.py)
        self.changes = PrimaryChanges()
        self.changes_logged = False  # every primary call that changes rows tapped
        self.primary = compat.primary_tier(manager)
        self.tiers = compat.secondary_tiers(manager)
        self.promotions: dict[int, TierJob] = {}  # scheduler thread (digests at completion)
        # When vLLM last submitted a tier job or saw one finish (scheduler thread; read by
        # the tier probe's, which waits for the tier to go quiet: busy())
        self.last_io = [0.0]
        self.cascades: dict[int, TierJob] = {}  # the aggregator thread (journal order)
        # (tier, keys) of completed cascades, for the tier probe's thread (tiers/probe.py),
        # appended on the aggregator thread
        self.written: deque[tuple[str, list[bytes]]] = deque(maxlen=WRITTEN_JOBS)
        # Cascades (several per step while busy) are summed here and handed to the
        # recorder by flush(): keys started / completed / failed, bytes, durations
        self._cascade_keys = [0, 0, 0]
        self._cascade_bytes = 0
        self._cascade_seconds: list[float] = []
        self._cascade_done_handler = self._cascade_done  # bound once, not per job
        self._cascades_done_handler = self._cascades_done
        # keys whose promotion started / found no row, as counted on vLLM's thread, and
        # as handed to the recorder by the last flush
        self._promotions_started = [0, 0]
        self._promotions_flushed = [0, 0]
        self._guard = recorder.guard(ErrorSite.TIER)
        # vLLM's own prepare_write for the rest of a tapped scan (_tap_primary): none
        # without the tap
        self.bare: Any = None
        with self._guard:
            for tier in self.tiers:
                self._tap_tier(tier)
            self._tap_primary()

    def declare(self) -> None:
        if self.tiers:
            one = lambda enum: [(v.value,) for v in enum]  # noqa: E731
            self.rec.declare(signals.PROMOTIONS, *one(PromotionResult))
            self.rec.declare(signals.CASCADES, *one(CascadeResult))
            self.rec.declare(signals.TRANSFER_BYTES, _DISK_TO_CPU, _CPU_TO_DISK)

    def _tap_primary(self) -> None:
        primary = self.primary
        original = getattr(primary, "prepare_write", None)
        if original is None or getattr(original, compat.WRAPPED_MARK, False) or not self.tiers:
            return
        rec, log, counts, cursor = self.rec, self.log, self._promotions_started, self.cursor
        expected, quarantine, forget = self.rows.expected, self.rows.quarantine, self.rows.forget
        changed = self.changes.keys.extend  # bounded by the per-job taps (_tap_row_changes)

        promote, refusals = cursor.promoted.extend, cursor.refusals.append
        ev = cursor.evicted
        evicted_at, evicted_n, evicted_keys = ev.at.append, ev.n.append, ev.keys.extend

        # Once per promoted key (vLLM promotes key by key during a lookup: thousands per
        # long restore's promoting scan). Inside a tapped scan (the usual case): vLLM's
        # answer copied out flat, ints and keys only (evictions.py: nothing kept that the
        # collector tracks), the rest done by _settle_scan as the scan returns. Outside one
        # (the per-key tap's lookups): at once. Counts kept here (only this thread writes
        # them; flush() hands the recorder what they grew by), no lock, no context manager.
        def prepare_write(keys, req_context, *a, **kw):
            # vLLM passes (keys, req_context): a plain call then, not one spread from
            # *a/**kw (~0.1 us less per promoted key; a 400k restore promotes 25,000)
            out = original(keys, req_context, *a, **kw) if a or kw else original(
                keys, req_context)
            try:
                it = cursor.it
                if it is not None:  # a tiering scan in progress (prefix_scan.py)
                    if out is not None:
                        promote(out.keys_to_store)
                        gone = out.evicted_keys
                        if gone:  # the lookup in progress: at n - hint - 1
                            evicted_at(it.__length_hint__())
                            evicted_n(len(gone))
                            evicted_keys(gone)
                    else:
                        refusals((it.__length_hint__(), len(keys)))
                elif out is None:
                    counts[1] += len(keys)
                    log.add_refusal(len(keys))
                else:
                    counts[0] += len(out.keys_to_store)
                    changed(out.keys_to_store)
                    evicted = out.evicted_keys
                    if evicted:
                        changed(evicted)
                        log.add_evictions(evicted)
                    if expected or quarantine:  # digests: forget rewritten rows' ones
                        forget(evicted)
                        forget(out.keys_to_store)
            except Exception as exc:
                rec.error(ErrorSite.TIER, exc)
            return out

        setattr(prepare_write, compat.WRAPPED_MARK, True)
        # vLLM's own is an instance attribute (the primary tier's prepare_store, bound):
        # what a tap's remover puts back (kvscope.sim.kvscope_switch)
        prepare_write.__wrapped__ = original
        primary.prepare_write = prepare_write
        cursor.settle = self._settle_scan

        def bare(on: bool) -> bool:
            """Scheduler thread, inside a tapped scan: ``on`` puts vLLM's own
            ``prepare_write`` back for the rest of it (no frame per promoted key; the scan
            tap reads what its promotions did from the primary tier's rows as it returns:
            bare_rest.BareRest), where this tap is the one in place; off, the tap again."""
            if on:
                if primary.prepare_write is not prepare_write:
                    return False
                primary.prepare_write = original
            else:
                primary.prepare_write = prepare_write
            return True

        self.bare = bare
        self._tap_row_changes(primary)

    def _settle_scan(self) -> None:
        """A tapped scan returned (scheduler thread): what its promotions did, noted flat
        by the tap, counted and its rows marked changed. The scan tap places the round's
        refusals and evictions at their lookups' indexes where the round needs them (an
        eviction's length hint stays a hint until then: prefix_scan.place). C-level passes
        (a long restore's promoting scan promotes ~8,190 keys, each evicting a row); a
        Python step only per refused promotion."""
        cursor, counts = self.cursor, self._promotions_started
        stored, ev, swept, last = cursor.promoted, cursor.evicted, cursor.swept, cursor.n - 1
        try:
            for hint, n in cursor.refusals:  # promotions that found no primary row: rare
                counts[1] += n
                cursor.refused.append((last - hint, n))
            counts[0] += len(stored)
            changed = self.changes.keys
            changed.extend(stored)
            if ev:
                changed.extend(ev.keys)
            if swept:
                changed.extend(swept)
            rows = self.rows
            if rows.expected or rows.quarantine:  # digests: forget rewritten rows' ones
                rows.forget(ev.keys)
                rows.forget(swept)
                rows.forget(stored)
        except Exception as exc:
            self.rec.error(ErrorSite.TIER, exc)
        finally:
            cursor.refusals.clear()

    def _tap_row_changes(self, primary: Any) -> None:
        """The primary tier's other calls that change rows (per job): a store's rows
        allocated and evicted, finished writes (ready, or removed on failure), a reset.
        The per-job taps are set only once a deferred scan is kept (``changes.watch``:
        scan_cache.DeferredScans); until then nothing reads the log, and a store job costs
        vLLM no frame of theirs. The reset's tap is set at once (an epoch a kept scan
        compares)."""
        changes, rec = self.changes, self.rec
        # PrimaryChanges.add inline (one frame less per store job and per finished write):
        # the log extended, reset past its bound
        log, limit, reset_log = changes.keys, changes.limit, changes.reset
        extend = log.extend
        watched: list[tuple[str, Any]] = []  # (name, tap) set by changes.watch

        def tapped(name: str, make: Any, per_job: bool = True) -> bool:
            original = getattr(primary, name, None)
            if original is None or getattr(original, compat.WRAPPED_MARK, False):
                return False
            tap = make(original)
            setattr(tap, compat.WRAPPED_MARK, True)
            tap.__wrapped__ = original  # what a tap's remover puts back (kvscope_switch)
            if per_job:
                # vLLM's own bound method in its place until then: the attribute is set now,
                # as the taps were, so that setting the tap later does not make CPython
                # build the tier's __dict__ (a new name on an object whose attributes live
                # inline: every attribute read of the tier slower from then on)
                setattr(primary, name, original)
                watched.append((name, tap))
            else:
                setattr(primary, name, tap)
            return True

        def watch() -> None:
            changes.watched = True
            for name, tap in watched:
                # vLLM's own still there (kvscope's switch may have put it back: the same
                # object), not a method a later wrapper put over it
                if getattr(primary, name, None) is tap.__wrapped__:
                    setattr(primary, name, tap)

        changes.watch = watch

        def store(original):
            def prepare_store(keys, req_context, *a, **kw):
                out = original(keys, req_context, *a, **kw)
                if out is not None:
                    try:
                        extend(out.keys_to_store)
                        gone = out.evicted_keys
                        if gone:
                            extend(gone)
                        if len(log) > limit:
                            reset_log()
                    except Exception as exc:
                        rec.error(ErrorSite.TIER, exc)
                return out
            return prepare_store

        def complete(original):
            def complete_store(keys, *a, **kw):
                try:
                    if type(keys) is not list:  # an iterator would be spent here
                        keys = list(keys)
                    extend(keys)  # before: a failed write's rows are removed
                    if len(log) > limit:
                        reset_log()
                except Exception as exc:
                    rec.error(ErrorSite.TIER, exc)
                return original(keys, *a, **kw)
            return complete_store

        def reset(original):
            def reset_cache(*a, **kw):
                changes.reset()
                return original(*a, **kw)
            return reset_cache

        # every one of them ours, or the change log would miss changes (scan_cache.py)
        self.changes_logged = all([tapped("prepare_store", store),
                                   tapped("complete_store", complete),
                                   tapped("complete_write", complete),
                                   tapped("reset_cache", reset, per_job=False)])

    def _tap_tier(self, tier: Any) -> None:
        if getattr(tier, compat.WRAPPED_MARK, False):
            return
        name = compat.tier_type(tier)
        submit_load, submit_store = tier.submit_load, tier.submit_store
        get_finished_jobs = tier.get_finished_jobs
        guard = self._guard

        last_io = self.last_io

        def tap_submit_load(job, *a, **kw):
            with guard:
                last_io[0] = now = time.monotonic()
                self.promotions[job.job_id] = TierJob(now, job, name)
            return submit_load(job, *a, **kw)

        journal, monotonic, rec = self.journal, time.monotonic, self.rec
        cascade_started, cascade_done = self._cascade_started, self._cascade_done_handler
        cascades_done = self._cascades_done_handler
        job_id_of, success_of = attrgetter("job_id"), attrgetter("success")
        promotions, promotion_done, extend = self.promotions, self._promotion_done, journal.extend
        promotion_seen = _nothing

        # A cascade: one journal event (started, recorded and summed on the aggregator
        # thread); a plain try, no context-manager frames, no object kept here.
        def tap_submit_store(job, *a, **kw):
            try:
                last_io[0] = now = monotonic()
                extend((cascade_started, 3, job, name, now))
            except Exception as exc:
                rec.error(ErrorSite.TIER, exc)
            return submit_store(job, *a, **kw) if a or kw else submit_store(job)

        # Per finished tier job: a promotion is recorded now (its rows digested before
        # vLLM can load them); anything else (a cascade: one per store job) goes to the
        # journal, where the aggregator thread matches it with a cascade it knows (with no
        # promotion in flight, the step's jobs in one event). Inline, a plain try: no frame
        # per job, none per call for the guard.
        def tap_get_finished_jobs(*a, **kw):
            results = list(get_finished_jobs(*a, **kw))
            if results:
                try:
                    last_io[0] = now = monotonic()
                    if not promotions:  # cascades only (most steps): one event for all,
                        # their ids and outcomes (C-level passes), not vLLM's objects
                        extend((cascades_done, 3, tuple(map(job_id_of, results)),
                                tuple(map(success_of, results)), now))
                        return results
                    for res in results:
                        job_id = res.job_id
                        if job_id in promotions:
                            promotion_done(job_id, bool(res.success), now)
                            # an event, so the aggregator refreshes the pending gauges
                            # after it (an idle engine journals nothing else)
                            extend((promotion_seen, 0))
                        else:
                            extend((cascade_done, 3, job_id, bool(res.success), now))
                except Exception as exc:
                    rec.error(ErrorSite.TIER, exc)
            return results

        tier.submit_load = tap_submit_load
        tier.submit_store = tap_submit_store
        tier.get_finished_jobs = tap_get_finished_jobs
        setattr(tier, compat.WRAPPED_MARK, True)

    def reading(self) -> bool:
        """Any thread: a promotion (a restore's reads from a secondary tier) is in flight."""
        return bool(self.promotions)

    def busy(self) -> bool:
        """Any thread: vLLM's tier I/O is in flight (a promotion, a cascade the aggregator
        has seen start) or was within the last ``QUIET_S``. Its read and write threads need
        the GIL between their system calls; a long restore waits on them (tiers/probe.py)."""
        return bool(self.promotions or self.cascades
                    or time.monotonic() - self.last_io[0] < QUIET_S)

    def _promotion_done(self, job_id: int, success: bool, now: float) -> None:
        """Scheduler thread: a promotion (a tier job of :attr:`promotions`) finished."""
        tj = self.promotions.pop(job_id)
        keys, rows = compat.job_keys(tj.job), compat.job_rows(tj.job)
        result = PromotionResult.COMPLETED if success else PromotionResult.FAILED
        self.rec.inc(signals.PROMOTIONS, (result.value,), len(keys))
        if success:
            self.rows.digest_promoted(keys, rows)
        if self.tracing:
            with self.tracer.start_as_current_span(signals.SPAN_PROMOTION) as span:
                span.set_attribute(signals.A_TIER, tj.tier)
                span.set_attribute(signals.A_ROW_COUNT, len(rows))
                span.set_attribute(signals.A_SUCCESS, success)
                span.set_attribute(signals.A_DURATION_S, now - tj.started)
        if success:
            self.rec.inc(signals.TRANSFER_BYTES, _DISK_TO_CPU, len(rows) * self.row_bytes)
            self.rec.observe(signals.TRANSFER_SECONDS, _DISK_TO_CPU, now - tj.started)

    # ---- the aggregator thread (journal order) ----------------------------------------
    def _cascade_started(self, job: Any, tier: str, started: float) -> None:
        self.cascades[job.job_id] = TierJob(started, job, tier)
        self._cascade_keys[0] += compat.job_key_count(job)

    def _cascades_done(self, job_ids: tuple, successes: tuple, now: float) -> None:
        """A step's finished tier jobs when no promotion was in flight (aggregator thread):
        each one :meth:`_cascade_done`."""
        done = self._cascade_done
        for job_id, success in zip(job_ids, successes):
            done(job_id, bool(success), now)

    def _cascade_done(self, job_id: int, success: bool, now: float) -> None:
        tj = self.cascades.pop(job_id, None)
        if tj is None:  # not a cascade kvscope saw start (submitted before the tap)
            return
        job = tj.job
        if success:
            keys = compat.job_keys(job)
            self._cascade_keys[1] += len(keys)
            self.written.append((tj.tier, keys))
            self._cascade_bytes += compat.job_row_count(job) * self.row_bytes
            self._cascade_seconds.append(now - tj.started)
        else:
            self._cascade_keys[2] += compat.job_key_count(job)

    def flush(self) -> None:
        """The cascades summed since the last flush, and the promotions counted since,
        into the recorder (aggregator)."""
        rec = self.rec
        counted, flushed = self._promotions_started[:], self._promotions_flushed
        for labels, now, then in ((_STARTED, counted[0], flushed[0]),
                                  (_NO_ROW, counted[1], flushed[1])):
            if now != then:
                rec.inc(signals.PROMOTIONS, labels, now - then)
        self._promotions_flushed = counted
        started, completed, failed = self._cascade_keys
        if started or completed or failed:
            for labels, n in ((_CASCADE_STARTED, started), (_CASCADE_COMPLETED, completed),
                              (_CASCADE_FAILED, failed)):
                if n:
                    rec.inc(signals.CASCADES, labels, n)
            self._cascade_keys = [0, 0, 0]
        if self._cascade_bytes:
            rec.inc(signals.TRANSFER_BYTES, _CPU_TO_DISK, self._cascade_bytes)
            self._cascade_bytes = 0
        if self._cascade_seconds:
            rec.observe_many(signals.TRANSFER_SECONDS, _CPU_TO_DISK, self._cascade_seconds)
            self._cascade_seconds = []
