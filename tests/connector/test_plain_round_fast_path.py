"""RoundVerdicts.judge_plain judges a plain hit or miss round of one full-attention KV group
inline (no Round, no per-group lists), from the round's lookups summarized on the scheduler
thread (lookup.rounds.summarize). It must add up to exactly what the general path
(``_judge`` on a ``Round``, then the request's state) adds up to, for every shape of round:
hits whole or short, misses, vetoed and deferred rounds (which it hands to the general
path), lookups before the round's start, offload-key lists longer than at the round's end,
computed tokens anywhere, refused stores at the miss or elsewhere. The verdict rooms are
built on a real observed engine's connector scheduler and primary tier (one full-attention
group: the fast path's case)."""

from __future__ import annotations

import itertools

import pytest

from kvscope.connector import compat
from kvscope.connector.lookup.request_states import RequestStates
from kvscope.connector.lookup.round_verdicts import RoundVerdicts
from kvscope.connector.lookup.rounds import LookupCounts, Round, summarize
from kvscope.connector.scheduler import hooks
from kvscope.connector.tiers.store_refusals import RefusedStores
from kvscope.exporters import signals as S
from kvscope.exporters.otel import get_tracer
from kvscope.exporters.recorder import Recorder
from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

pytestmark = pytest.mark.vllm


def _rooms(observer) -> RoundVerdicts:
    refused = RefusedStores()
    verdicts = RoundVerdicts(
        recorder=Recorder(), tracer=get_tracer(None), connector_scheduler=observer.cs,
        primary=observer.primary, requests=RequestStates(observer.requests._chunk_tokens),
        refused_stores=refused)
    verdicts.declare()
    return verdicts


def _general(verdicts: RoundVerdicts, keys, results, start, rid, req_tokens, offload,
             num_tokens, num_computed) -> None:
    """The path every round took before the fast one (scheduler.observer's _plain_round)."""
    verdicts._judge(Round.plain(keys, results, start), rid, req_tokens, offload, num_tokens,
                    num_computed)
    verdicts.requests.on_round(rid, req_tokens, num_tokens is None)


def _state(verdicts: RoundVerdicts) -> tuple:
    verdicts.flush()
    verdicts.rec.flush()
    snap = verdicts.rec.snapshot()
    return (snap.counters, snap.gauges,
            {k: (h.count, h.total, h.counts) for k, h in snap.histograms.items()},
            verdicts.requests.state, verdicts.requests.counts, verdicts.requests.need)


def test_the_fast_path_adds_up_to_the_general_one():
    with CPUEngine(EngineConfig(rows=12)) as e:
        observer = e.connector._kvscope_observer
        fast, general = _rooms(observer), _rooms(observer)
        # a round of one group handed over as its counts (the hook's, start 0) is judged
        # by judge_counted: it must add up to the general path too, lookup counts included
        counted_room, counted_general = _rooms(observer), _rooms(observer)
        counted_lookups, general_lookups = LookupCounts(fast.groups[0][0]), LookupCounts(
            fast.groups[0][0])
        counted_room.count_counted = counted_lookups.add_counted
        tpc = fast._single_tpc
        assert tpc > 0  # one full-attention group: the fast path's case
        taken_general = []
        inner = fast._judge
        fast._judge = lambda *a: taken_general.append(1) or inner(*a)
        suffix = fast.groups[0][0]
        counts = LookupCounts(suffix)
        keys = [bytes([i + 1]) * 8 + suffix for i in range(5)]
        hit, miss, retry = compat.HIT, compat.MISS, compat.RETRY
        rounds = 0
        for n, extra, start, found, computed, refused in itertools.product(
                range(0, 5), (0, 1), (0, 2), range(0, 6), (0, tpc // 2, tpc, 3 * tpc),
                ((), (0,), (1,))):
            rid = f"r{rounds}"
            looked = keys[:n]
            results = [hit if i < found else miss for i in range(n)]
            if found > n:  # a pending lookup: vetoed if offered nothing, else deferred
                results = [retry] * n
            before = [keys[-1]] * start  # lookups outside the round (counted, not judged)
            lookups, answers = before + looked, [miss] * start + results
            offload_keys = keys[:n + extra]  # as captured: one group's list, its length
            for verdicts in (fast, general, counted_room, counted_general):
                verdicts.refused_stores.refused([keys[i] for i in refused if i < n])
                verdicts.requests.on_new(rid)
            for num_tokens in (None, 0, tpc,  # tpc: one chunk of more found (load_cap)
                               found * tpc - computed if found * tpc > computed else 0,
                               max(n * tpc - computed, 0) or None):
                fast.judge_plain(rid, n * tpc + 7, offload_keys, n, num_tokens, computed,
                                 counts.tally(lookups, answers),
                                 summarize(lookups, answers, start, False))
                _general(general, lookups, answers, start, rid, n * tpc + 7,
                         ([offload_keys], (n,)), num_tokens, computed)
                if not start:
                    misses = results.count(miss)
                    counted = (*(results.count(v) for v in (hit, compat.HIT_PENDING, retry,
                                                            miss)),
                               n, looked[results.index(miss)] if misses else None)
                    counted_room.judge_counted(rid, n * tpc + 7, offload_keys, n, num_tokens,
                                               computed, counted)
                    general_lookups.add(general_lookups.tally(looked, results))
                    _general(counted_general, looked, results, 0, rid, n * tpc + 7,
                             ([offload_keys], (n,)), num_tokens, computed)
                rounds += 1
        assert _state(fast) == _state(general)
        assert _state(counted_room) == _state(counted_general)
        assert counted_lookups.counts == general_lookups.counts and counted_lookups.counts
        assert taken_general and rounds - len(taken_general) > rounds / 3  # both paths ran
        rec = fast.rec  # every branch of the fast path was taken
        assert rec.value(S.HIT_TOKENS) > 0 and rec.value(S.RESTORE_HELD_TOKENS) > 0
        assert rec.value(S.RESTORE_COVERAGE) > 0
        for reason in (S.ShortReason.NOT_STORED, S.ShortReason.STORE_REFUSED,
                       S.ShortReason.LOAD_CAP):
            assert rec.value(S.RESTORE_SHORT_ROUNDS, (reason.value,)) > 0, reason


def test_a_plain_round_of_one_group_is_handed_over_as_its_counts():
    """The connector's hook hands a plain round of one KV group over as its counts (per
    result, keys consumed, the first MISS's key: LookupLog.counted's shape), which the
    aggregator thread turns into the lookups' counts and the round's facts: they must be
    what ``LookupCounts.tally`` and ``summarize`` make of the same lookups, for every shape
    of round (hits, a stop at a miss, pending keys, several misses, none looked up, long)."""
    from types import SimpleNamespace

    from kvscope.connector.lookup.rounds import LookupCounts, summarize_counted
    from kvscope.connector.scheduler.hooks import _hooks

    with CPUEngine(EngineConfig(rows=12)) as e:
        observer = e.connector._kvscope_observer
        lookups, log = observer.lookups, observer.log
        assert lookups.only_suffix is not None  # one KV group: the counted hand-over
        suffix = lookups.only_suffix
        long = 65
        keys = [i.to_bytes(8, "big") + suffix for i in range(1, long + 3)]
        hit, miss, retry = compat.HIT, compat.MISS, compat.RETRY
        pending = compat.HIT_PENDING
        shapes = [[], [hit], [miss], [hit, hit, miss], [hit] * 6, [retry, hit, miss],
                  [pending, pending, retry], [hit, miss, hit, miss], [miss, miss],
                  [hit] * long + [miss], [retry] * long + [hit]]
        answer: list = []

        def ask(request, num_computed):  # vLLM's lookups of the round, then its answer
            log.keys.extend(keys[:len(answer[0])])
            log.results.extend(answer[0])
            return answer[1], False

        parent = SimpleNamespace(get_num_new_matched_tokens=ask, **{
            name: None for name in hooks.HOOKED
            if name != "get_num_new_matched_tokens"})
        hook = _hooks(parent, observer)["get_num_new_matched_tokens"]
        with observer.agg.lock:  # the aggregator thread leaves the journal alone
            observer.agg.drain()
            for i, results in enumerate(shapes):
                for num_tokens in (None, 0, 16):
                    answer[:] = [results, num_tokens]
                    looked = keys[:len(results)]
                    journal = observer.journal
                    at = len(journal)
                    hook(SimpleNamespace(request_id=f"r{i}", num_tokens=99), 0)
                    assert not log.keys and not log.results and log.start == -1
                    event = journal[at:]
                    del journal[at:]
                    assert event[0] == observer._judge_counted, event[0]
                    assert event[1] == 9 and len(event) == 11, event
                    counted = event[8]
                    # the aggregator's sums of the counts: those of the lookups' tally
                    got_counts, want_counts = LookupCounts(suffix), LookupCounts(suffix)
                    got_counts.add_counted(counted)
                    want_counts.add(lookups.tally(looked, results))
                    assert got_counts.counts == want_counts.counts, results
                    got, want = summarize_counted(counted), summarize(looked, results, 0,
                                                                      False)
                    for name in want.__slots__:
                        assert getattr(got, name) == getattr(want, name), (results, name)
