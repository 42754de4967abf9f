"""The scheduler-role connector calls kvscope observes, bound once per connector.

vLLM's scheduler calls these on its connector per request (twice when a tier's
existence checks defer the first lookup: ``get_num_new_matched_tokens``), per store
job and per step. A method of the subclass would pay per call a ``super()`` object,
attribute lookups, a check that the observer exists and a call into the observer
(several Python frames: the round's begin, its end, ``plain()``...). Here each hook
is a closure over what it needs, bound once when the scheduler-side observer is
built, set as an instance attribute that shadows the class's method (vLLM calls
``self.connector.<name>(...)``): one Python frame of kvscope per vLLM call, the
common case of the recording inline. The rare cases (a round with a quarantined
key, a refused promotion or an eviction; tracing; an idle step; the end of a step that
left no request: ``SchedulerObserver.settle``) call the observer
(scheduler/observer.py), which holds the general code.

Each hook forwards the call unchanged to the stock connector's method (the parent's
bound method, taken once) and records after it, guarded: an exception of kvscope is
counted (``kvscope_telemetry_errors_total``), never raised into vLLM.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import perf_counter
from typing import Any

from kvscope.connector import compat
from kvscope.connector.lookup.rounds import summarize
from kvscope.connector.scheduler.observer import SchedulerObserver
from kvscope.exporters.signals import ErrorSite

logger = logging.getLogger("kvscope")

HOOKED = ("on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc",
          "build_connector_meta", "update_connector_output", "request_finished",
          "request_finished_all_groups", "get_kv_connector_stats")

# The hooks that keep the observer's live requests (a request enters at its first, leaves
# at either of the others): all installed, or the set is not kept
_LIVE_HOOKS = frozenset(("on_new_request", "request_finished", "request_finished_all_groups"))


def install(connector: Any, observer: SchedulerObserver, own_cls: type) -> None:
    """Set the hooks on ``connector``, an instance of ``own_cls`` (kvscope's subclass of
    vLLM's connector; the stock methods: ``super(own_cls, connector)``). A method a
    further subclass overrides is left to it (kvscope does not see those calls)."""
    overridden = {name for name in HOOKED
                  if getattr(type(connector), name) is not getattr(own_cls, name)}
    if overridden & _LIVE_HOOKS:  # the live requests cannot be kept: none are
        observer._live = None
    hooks = _hooks(super(own_cls, connector), observer)
    for name in HOOKED:
        if name in overridden:
            logger.warning("kvscope: %s.%s is overridden: its calls are not observed",
                           type(connector).__name__, name)
            continue
        setattr(connector, name, hooks[name])


def _hooks(parent: Any, obs: SchedulerObserver) -> dict[str, Callable[..., Any]]:
    # the journal is flat (aggregator.py): per event one extend of handler, k, k args
    log, journal_extend, rec_error = obs.log, obs.journal.extend, obs.rec.error
    # the lookup slots (lists kept for the log's life: emptied in place, never replaced)
    keys, results = log.keys, log.results
    # the evictions' list of places: its truth is theirs, without Evictions.__bool__'s frame
    quarantined, refusals, evictions = log.quarantined, log.refusals, log.evictions.at
    judge_plain, capture = obs._judge_plain, obs._offload_prefix
    tally, several = obs.lookups.tally, obs.lookups.only_suffix is None
    on_new, after_alloc, on_finished = obs._on_new, obs._after_alloc, obs._on_finished
    skip_attr = compat.SKIP_PREFIX_CACHE_ATTR
    live = obs._live  # a set kept for the observer's life, or None (install)
    ask = parent.get_num_new_matched_tokens
    judge_counted = obs._judge_counted  # bound once (a bound method per event allocates)
    # a one-group round's counts, inline (a frame less per round): HIT, HIT_PENDING, RETRY
    # and MISS counts, keys consumed, the first MISS's key (LookupLog.counted's shape)
    count, find = results.count, results.index
    hit, pending, retry, miss = compat.HIT, compat.HIT_PENDING, compat.RETRY, compat.MISS

    def get_num_new_matched_tokens(request, num_computed_tokens):
        if getattr(request, skip_attr, False):
            # a request that reads no cached KV (prompt_logprobs) is looked up nowhere: no
            # round, else its whole stored prefix would count as held and not offered
            return ask(request, num_computed_tokens)
        if obs._tracing:  # the round's span: the general path
            return obs.traced_round(ask, request, num_computed_tokens)
        # the round begins: the lookups this call makes are results[start:]
        if quarantined or refusals or evictions:  # left from outside a round
            log.begin()
        else:
            log.start = len(results)
        log.compact = True  # a deferred scan may leave its lookups counted (prefix_scan.py)
        started = perf_counter()  # the round's time (restore_clock.py)
        try:
            result = ask(request, num_computed_tokens)
        finally:
            log.compact = False
        took = perf_counter() - started
        counted, log.counted = log.counted, None
        try:
            if quarantined or refusals or evictions:  # a rare event: judged now
                obs.end_round(request, result[0], num_computed_tokens, started, took)
                return result
            # A plain round: what judging it needs (the request's token count, its
            # offload-key list(s) and length(s)) and its lookups summarized into one journal
            # event of O(groups) objects, the slots emptied; judged on the aggregator thread
            # (RoundVerdicts.judge_plain). One KV group (most models): the counts per result,
            # the keys consumed and the first MISS's key (C-level passes, inline below; a
            # tuple of ints and a key, which no garbage collection keeps tracking,
            # where copies of the slots would stay tracked in the journal until it is
            # applied), as a deferred scan leaves them counted (scan_cache.py), judged from
            # them off this thread (RoundVerdicts.judge_counted). Several: lookup.rounds.tally
            # and summarize here. A deferred round (None) captures no offload keys: coverage
            # judges only rounds that ended
            num_tokens, rid = result[0], request.request_id
            if num_tokens is None:
                offload = lengths = None
            else:
                offload, lengths = capture(rid)
            if counted is None and (several or log.start):
                counts, facts = tally(keys, results), summarize(keys, results, log.start,
                                                               several)
                journal_extend((judge_plain, 10, rid, request.num_tokens, offload, lengths,
                                num_tokens, num_computed_tokens, counts, facts, started,
                                took))
            else:
                if counted is None:  # the round's lookups are the whole slots (start 0)
                    misses = count(miss)
                    counted = (count(hit), count(pending), count(retry), misses, len(results),
                               keys[find(miss)] if misses else None)
                journal_extend((judge_counted, 9, rid, request.num_tokens, offload, lengths,
                                num_tokens, num_computed_tokens, counted, started, took))
            del keys[:], results[:]
            log.start = -1
        except Exception as exc:
            rec_error(ErrorSite.ROUND, exc)
        return result

    new_request = parent.on_new_request

    def on_new_request(request):
        new_request(request)
        try:
            rid = request.request_id
            journal_extend((on_new, 1, rid))
            if live is not None:
                live.add(rid)
        except Exception as exc:
            rec_error(ErrorSite.STEP, exc)

    alloc = parent.update_state_after_alloc

    def update_state_after_alloc(request, blocks, num_external_tokens):
        out = alloc(request, blocks, num_external_tokens)
        try:
            journal_extend((after_alloc, 3, request.request_id, num_external_tokens,
                            perf_counter() if num_external_tokens else 0.0))
        except Exception as exc:
            rec_error(ErrorSite.STEP, exc)
        return out

    def finished_hook(finish: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def request_finished(request, block_ids):
            out = finish(request, block_ids)
            try:
                rid = request.request_id
                journal_extend((on_finished, 1, rid))
                if live:
                    live.discard(rid)
                    if not live:  # vLLM's last request: this step's end settles (settle)
                        obs.settle_due = True
            except Exception as exc:
                rec_error(ErrorSite.STEP, exc)
            return out
        return request_finished

    rows = obs.rows
    load_keys, load_jobs = rows._load_keys, rows._load_jobs  # dicts kept for rows' life
    on_meta, on_step, build = rows.on_meta, obs.on_step, parent.build_connector_meta

    def build_connector_meta(scheduler_output):
        meta = build(scheduler_output)
        if load_keys:  # checked loads waiting for their job ids (rows.on_meta)
            on_meta(meta)
        on_step(scheduler_output)
        return meta

    on_output, update = obs.on_connector_output, parent.update_connector_output

    def update_connector_output(connector_output):
        if load_jobs:  # checked loads in flight (rows.on_connector_output)
            on_output(connector_output)
        return update(connector_output)

    ready, take, stock_stats = obs.ready_stats, obs.take_stats, parent.get_kv_connector_stats
    settle = obs.settle

    def get_kv_connector_stats():
        # vLLM calls this at the end of every step, after it freed what the step finished
        stats = stock_stats()
        if live is not None and not live:  # no request left: did the engine settle?
            settle()
        if not ready:  # nothing the aggregator prepared since the last call (most steps)
            return stats
        try:
            ours = take()
            if ours is None:
                return stats
            return ours if stats is None or stats.is_empty() else ours.aggregate(stats)
        except Exception as exc:
            rec_error(ErrorSite.STATS, exc)
            return stats

    return {"on_new_request": on_new_request,
            "get_num_new_matched_tokens": get_num_new_matched_tokens,
            "update_state_after_alloc": update_state_after_alloc,
            "build_connector_meta": build_connector_meta,
            "update_connector_output": update_connector_output,
            "request_finished": finished_hook(parent.request_finished),
            "request_finished_all_groups": finished_hook(parent.request_finished_all_groups),
            "get_kv_connector_stats": get_kv_connector_stats}
