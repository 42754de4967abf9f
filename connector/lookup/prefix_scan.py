"""A round's lookups read from vLLM's prefix scan: one tap per scan, none per key.

Where compat.prefix_scan allows it (vLLM's CPU manager alone, one full-attention KV
group), the manager proxy leaves ``lookup`` untapped and this tap on the connector
scheduler's scan writes, after each scan, what its per-key lookups were into the same
slots the per-key tap fills (lookup.rounds.LookupLog): everything after that (the
round's hand-over, its verdict, coverage and counts) is unchanged. An answer of ``n``
is n HITs and a MISS (unless the scan reached the end): two list extends in C. A
deferred answer (None: some key was pending) reads each key's result from the CPU tier's cache
policy (compat.scan_reader), as the lookups did, up to the first key it lacks.

With a secondary tier (vLLM's tiering manager over its CPU tier and fs tiers:
compat.tiered_scan_reader) :func:`tiered_scan_tap` hands vLLM's scan an iterator over its
keys, so how many it consumed is the iterator's length hint afterwards, and reads a
deferred scan's lookups from the tiers' state right after it (C-level passes over the
primary rows); what a lookup's promotion did (rows written, rows evicted, refused) is noted
by the primary tier's ``prepare_write`` tap in a :class:`ScanCursor`, at the lookup in
progress, or, for a promoting scan whose request had no primary row, read from the primary
rows as it returns (:class:`BareRest`: no frame of kvscope's per promoted key). A
131k-token restore is ~8,190 keys re-scanned every step it is deferred.

The per-key tap cost a Python frame per key looked up (~6,200 per iteration in the
H200 benchmark: 96 re-asks of 64 chunks); this costs one per round.
``tests/connector/test_prefix_scan.py`` checks, scan by scan on every scenario (CPU tier
alone and tiering, settled and racing tiers) and a long deferred restore, that it writes
what the per-key tap records (keys, results, refusals, evictions), and that the evictions
it leaves out of a round could not have been the round's own.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from typing import Any

from kvscope.connector import compat
from kvscope.connector.compat.prefix_scan import SCAN_METHOD
from kvscope.connector.lookup.bare_rest import BareRest
from kvscope.connector.lookup.evictions import Evictions
from kvscope.connector.lookup.rounds import LookupLog
from kvscope.connector.lookup.scan_cache import DeferredScans, count
from kvscope.exporters.signals import ErrorSite


def scan_tap(inner_scan: Callable[..., Any], log: LookupLog, result_of: Callable[[bytes], Any],
             error: Callable[[ErrorSite, BaseException], None]) -> Callable[..., Any]:
    """The scan's stand-in: vLLM's scan, then its lookups written into ``log``.
    ``result_of``: a key's lookup result read without a lookup (compat.scan_reader)."""
    keys_out, results_out = log.keys, log.results
    add_keys, add_results, add_key, add_result = (
        keys_out.extend, results_out.extend, keys_out.append, results_out.append)
    hit, miss = compat.HIT, compat.MISS

    # *rest: 0.33 passes the request, the group's config and the first chunk's index
    def scan(keys, req_context, *rest):
        n = inner_scan(keys, req_context, *rest)
        k0, r0 = len(keys_out), len(results_out)
        try:
            if n is not None:  # n HITs, then the MISS that stopped it (if it stopped)
                if n < len(keys):
                    add_keys(keys[:n + 1])
                    add_results([hit] * n)
                    add_result(miss)
                else:
                    add_keys(keys)
                    add_results([hit] * n)
            else:  # deferred: what the lookups read, up to the first key the tier lacks
                for key in keys:
                    result = result_of(key)
                    add_key(key)
                    add_result(result)
                    if result is miss:
                        break
        except Exception as exc:  # this scan's lookups are lost, the slots stay paired
            del keys_out[k0:], results_out[r0:]
            error(ErrorSite.LOOKUP, exc)
        return n

    setattr(scan, compat.WRAPPED_MARK, True)
    return scan


class ScanCursor:
    """Where a tapped tiering scan is (scheduler thread): open (``it``: the iterator vLLM's
    scan consumes) only while :func:`tiered_scan_tap` runs one. The primary tier's
    ``prepare_write`` tap (tiers/taps.py) notes here what the lookup in progress did: the
    keys its promotion wrote rows for, the keys it evicted, a refused promotion.

    While the scan runs the tap copies each of vLLM's answers out flat (its keys into
    ``promoted``, its evictions into ``evicted`` with the iterator's length hint for an
    index) or notes a refusal (the hint and the keys' count) in ``refusals``: nothing kept
    per promotion that the collector tracks (evictions.py). ``settle`` (set by the tap's
    owner) counts them and turns hints into indexes as the scan returns
    (tiers.taps.TierTaps._settle_scan)."""

    __slots__ = ("it", "n", "promoted", "evicted", "refused", "refusals", "swept", "settle")

    def __init__(self) -> None:
        self.it: Any = None
        self.n = 0
        # never rebound: the tap holds their bound methods
        self.promoted: list[bytes] = []
        self.evicted = Evictions()  # (index in the scan, keys); length hints until placed
        self.refused: list[tuple[int, int]] = []  # (index in the scan, keys)
        self.refusals: list[tuple[int, int]] = []  # (length hint, keys)
        # keys whose rows a bare rest of the scan (BareRest) evicted: no key of its round
        self.swept: list[bytes] = []
        self.settle: Callable[[], None] = _nothing


def _nothing() -> None:
    """A cursor's ``settle`` until a tap owns it."""


_NO_EVICTIONS = Evictions()  # never added to

# A bare rest saves ~0.4 us per promoted key after the first (the tap's frame) and costs a
# fixed ~10 us (its decision, BareRest, the sweep) plus ~50 ns per primary row (the sweep's
# copy and pass over the rows): on a short scan, most scans, it only added to vLLM's step
BARE_MIN_KEYS = 64
BARE_ROWS_PER_KEY = 8
# Handing vLLM's scan the real manager saves ~25 ns a key, and costs two calls a scan
DIRECT_MIN_KEYS = 16
# Below this many keys the results-only tap (a frame a key) costs less than this tap's reading
SCAN_MIN_KEYS = 16


def place(evicted: Evictions, total: int) -> None:
    """Each eviction's length hint (the scan's keys not yet consumed as it happened) made
    the index of its lookup in a scan of ``total`` keys (one C-level pass)."""
    evicted.at[:] = map((total - 1).__sub__, evicted.at)


def tiered_scan_tap(inner_scan: Callable[..., Any], log: LookupLog,
                    reader: compat.TieredReader, cursor: ScanCursor,
                    quarantine: dict[bytes, None],
                    per_key: tuple[Callable[[], None], Callable[[], None],
                                   Callable[[], None]],
                    error: Callable[[ErrorSite, BaseException], None],
                    scans: DeferredScans | None = None,
                    direct: Callable[[bool], None] | None = None,
                    bare: Callable[[bool], bool] | None = None) -> Callable[..., Any]:
    """The scan's stand-in with a secondary tier (compat.tiered_scan_reader): vLLM's scan
    handed an iterator over its keys (how many it consumed: ``len(keys)`` less the
    iterator's length hint, no frame per key), then its lookups written into ``log``: an
    answer of ``n`` as :func:`scan_tap` writes it, a deferred one read from the tiers' state
    (``read``). The rare events the primary tier's tap recorded during the scan (refused
    promotions, evictions) are given the index of the lookup they happened in, as the
    per-key tap's are. While a key is quarantined (kvscope answers MISS for it, per key),
    ``per_key`` (on, results only, off: ManagerProxy.per_key_switches, C-level calls) puts
    the per-key tap in place for that scan and removes it after; for a scan shorter than
    ``SCAN_MIN_KEYS``, its results-only tap (a lookup's result, the keys after the scan).

    ``direct(True)`` hands vLLM's scan the real manager for its lookups, ``direct(False)``
    puts the manager proxy back: the proxy's ``__getattr__`` keeps CPython from
    specializing ``self.manager.lookup`` in vLLM's loop (~25 ns a key, every key of every
    scan), and with the per-key tap off the proxy adds nothing to a lookup: for a scan of
    ``DIRECT_MIN_KEYS`` keys or more (on a shorter one the two calls cost more).

    With ``scans`` (scan_cache.py), a deferred scan of a plain round (``log.compact``) with
    no refused promotion or eviction is counted from the request's kept row states instead
    (``log.counted``): the cost is per row changed since its last scan, not per key.

    With ``bare`` (the primary tier's tap: tiers.taps.TierTaps.bare), a scan likely to
    promote (its first key has no primary row and a secondary tier has it or has not
    answered yet) whose keys have no primary row at all, opening its round, runs its keys
    after the first without the primary tier's tap (:class:`BareRest`), where it pays:
    ``BARE_MIN_KEYS`` keys or more, and at least one per ``BARE_ROWS_PER_KEY`` primary rows."""
    keys_out, results_out = log.keys, log.results
    read, last_answer, promoted_retry = reader.read, reader.last_answer, reader.promoted_retry
    places_of = scans.places if scans is not None else None
    all_written = scans.written if scans is not None else None
    add_keys, add_results, add_result = keys_out.extend, results_out.extend, results_out.append
    refusals_out, evictions_out = log.refusals, log.evictions
    evictions_at = evictions_out.at  # never rebound: len() and truth without a frame
    hit, miss = compat.HIT, compat.MISS
    # what a lookup that started a promotion answers (0.26 RETRY, 0.33 HIT_PENDING)
    promoted_answer = compat.RETRY if promoted_retry else compat.HIT_PENDING
    promoted, evicted, refused = cursor.promoted, cursor.evicted, cursor.refused
    evicting = evicted.at  # never rebound: its truth is the evictions' (no __bool__ frame)
    rows, may_promote, promotes = reader.rows, reader.may_promote, reader.promotes
    per_key_on, results_on, per_key_off = per_key

    def scan(keys, req_context, *rest):
        # rare (a key quarantined, keys not a list): each lookup recorded by the proxy
        if quarantine or type(keys) is not list:
            per_key_on()
            try:
                return inner_scan(keys, req_context, *rest)
            finally:
                per_key_off()
        total = len(keys)
        if total < SCAN_MIN_KEYS:  # a short scan (most): each lookup's result by the proxy,
            k0 = len(keys_out)     # the keys it consumed (in order) after it, one slice
            results_on()
            try:  # 0.26 passes (keys, req_context): a plain call then (no tuple built)
                return inner_scan(keys, req_context, *rest) if rest else inner_scan(
                    keys, req_context)
            finally:
                per_key_off()
                add_keys(keys[:len(results_out) - k0])
        r0, e0 = len(refusals_out), len(evictions_at)
        if promoted or evicting or refused:  # left by a scan vLLM's call raised out of
            promoted.clear()
            evicted.clear()
            refused.clear()
        it = cursor.it = iter(keys)
        cursor.n = total
        arm = first = None
        feed = it
        try:  # never an exception into vLLM's scan: then its keys all run with the tap
            if (bare is not None and total >= BARE_MIN_KEYS and len(results_out) == log.start
                    and total * BARE_ROWS_PER_KEY >= len(rows())
                    and may_promote(keys[0], req_context)
                    and rows().keys().isdisjoint(keys)):
                # the first key with the tap (the step's poll of finished tier jobs happens
                # in its lookup), then BareRest, then the others (``it``: its length hint,
                # as the tap reads it for the first key's promotion)
                arm, first = BareRest(rows, bare, error), iter(keys[:1])
                next(it)
                feed = chain(first, arm, it)
        except Exception as exc:
            error(ErrorSite.LOOKUP, exc)
            arm = first = None
            it = cursor.it = iter(keys)
            feed = it
        swap = direct is not None and total >= DIRECT_MIN_KEYS
        if swap:
            direct(True)
        try:
            n = inner_scan(feed, req_context, *rest)
        finally:
            if swap:
                direct(False)
            cursor.it = None
            if arm is not None and arm.before is not None:
                bare(False)
                try:
                    arm.sweep(keys, total - it.__length_hint__(), cursor, req_context,
                              promotes)
                except Exception as exc:
                    error(ErrorSite.LOOKUP, exc)
            if promoted or cursor.refusals or cursor.swept:
                cursor.settle()
        k0 = len(results_out)
        # the scan's evictions took no row its round had found (Round.self_evicted is 0):
        # left out of the round, which stays plain (judged off vLLM's thread), as the
        # oracle judges it
        unjudged = False
        placed = False  # the tap noted length hints: indexes once the round needs them
        try:
            m = total - it.__length_hint__()
            if first is not None and not arm.reached:  # the scan stopped at its first key
                m = 1 - first.__length_hint__()
            if n is not None:  # n HITs, then the MISS that stopped it (if it stopped)
                add_keys(keys[:m] if m < total else keys)
                add_results([hit] * n)
                if m > n:
                    add_result(miss)
            elif (places_of is not None and log.compact and m and not (evicting or refused)
                  and k0 == log.start and not (refusals_out or evictions_at)):
                last = keys[m - 1]
                places, absent, writing = places_of(keys, req_context)
                log.counted = (*count(places, m, len(promoted) if promoted_retry else 0,
                                      m < total, lambda: last_answer(last, req_context),
                                      (absent, writing)), m, last)
            else:
                consumed = keys[:m] if m < total else keys
                if m and len(promoted) == m and promoted == consumed:
                    # each lookup promoted its own key (a restore from disk's promoting
                    # scan): each answered as a started promotion does, no row read; the
                    # request's rows are all being written now. None of its keys was in
                    # the primary tier when looked up, and a row being written is never
                    # evicted, so its evictions took no key it had found
                    results = [promoted_answer] * m
                    if all_written is not None and m == total:
                        all_written(keys, req_context)
                    unjudged = k0 == log.start
                else:
                    # a found key a later promotion evicted is a HIT (read): a long
                    # restore's promotions evict other prompts' rows, a C-level test first
                    apart = bool(evicted) and set(evicted.keys).isdisjoint(consumed)
                    if evicted and not apart:
                        place(evicted, total)
                        placed = True
                    results = read(consumed, req_context, m < total, promoted,
                                   _NO_EVICTIONS if apart else evicted, refused)
                    unjudged = apart and k0 == log.start
                add_keys(consumed)
                add_results(results)
            if refused or evicting:  # recorded at the scan's start: at their lookups instead
                del refusals_out[r0:]
                refusals_out.extend((k0 + i, c) for i, c in refused)
                if log.start >= 0:
                    evictions_out.truncate(e0)
                    if evicted and not unjudged:
                        if not placed:
                            place(evicted, total)
                        evictions_out.extend(evicted, k0)
        except Exception as exc:  # this scan's lookups are lost, the slots stay paired
            del keys_out[k0:], results_out[k0:]
            error(ErrorSite.LOOKUP, exc)
        finally:
            if promoted or evicting or refused or cursor.swept:
                promoted.clear()
                evicted.clear()
                refused.clear()
                cursor.swept.clear()
        return n

    setattr(scan, compat.WRAPPED_MARK, True)
    return scan


def install(connector_scheduler: Any, log: LookupLog, result_of: Callable[[bytes], Any],
            error: Callable[[ErrorSite, BaseException], None]) -> bool:
    """Tap the connector scheduler's scan (an instance attribute shadowing vLLM's method);
    False when it already is."""
    inner = getattr(connector_scheduler, SCAN_METHOD)
    if getattr(inner, compat.WRAPPED_MARK, False):
        return False
    setattr(connector_scheduler, SCAN_METHOD, scan_tap(inner, log, result_of, error))
    return True


def install_tiered(connector_scheduler: Any, log: LookupLog, reader: compat.TieredReader,
                   cursor: ScanCursor, quarantine: dict[bytes, None],
                   per_key: tuple[Callable[[], None], Callable[[], None],
                                  Callable[[], None]],
                   error: Callable[[ErrorSite, BaseException], None],
                   scans: DeferredScans | None = None,
                   direct: Callable[[bool], None] | None = None,
                   bare: Callable[[bool], bool] | None = None) -> bool:
    """:func:`install` with a secondary tier (:func:`tiered_scan_tap`)."""
    inner = getattr(connector_scheduler, SCAN_METHOD)
    if getattr(inner, compat.WRAPPED_MARK, False):
        return False
    setattr(connector_scheduler, SCAN_METHOD,
            tiered_scan_tap(inner, log, reader, cursor, quarantine, per_key, error, scans,
                            direct, bare))
    return True
