"""Where a round's per-key lookups can be read from the prefix scan's answer.

vLLM 0.26 .. 0.34 scan a full-attention group's offload keys in one method of the
connector scheduler, ``_maximal_prefix_lookup(keys, req_context, ...)``: it looks keys
up in order, stops at the first MISS, and answers the number of hits, or None when a
key was pending (HIT_PENDING, RETRY: the lookup is deferred). So an answer of ``n``
means exactly: ``n`` HITs, then one MISS unless the scan reached the end of ``keys``.

A deferred answer does not say which keys were pending. vLLM's CPU manager answers a
lookup from its cache policy alone (``_policy.get``: absent MISS, not ready
HIT_PENDING, else HIT; 0.26's store-threshold counts aside, which decide nothing
here), so reading the policy right after the scan, still inside vLLM's call, gives
the same results the scan got.

The scan reads every lookup of a round only when nothing else looks keys up:
one KV group, full attention (no sliding-window scan), no secondary tier (a tiering
lookup may start a promotion: its results are not the policy's), no 0.33 partial-tail
lookup (models with a recurrent group), and vLLM's own CPU manager (its ``lookup``
not overridden), on a release whose scan was read (0.26 .. 0.34; 0.34's scan and lookups are 0.33's).

With a secondary tier (vLLM's tiering manager over its CPU primary tier and fs tiers),
:func:`tiered_scan_reader` reads a deferred scan's lookups from the tiers' state right
after it (see there); anywhere else the manager proxy records each key (manager_proxy.py).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Sequence
from itertools import repeat
from types import SimpleNamespace
from typing import Any, NamedTuple

from vllm.v1.kv_offload.base import LookupResult

import kvscope.connector.compat.versions as versions
from kvscope.connector.compat.tiers import secondary_tiers

SCAN_METHOD = "_maximal_prefix_lookup"


def _cpu_manager_lookup() -> Any:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    return CPUOffloadingManager.lookup


def _scan_tells_lookups(connector_scheduler: Any) -> bool:
    """A supported release, the scan method there, one full-attention KV group, no 0.33
    partial tail: every lookup of a round is one of the prefix scan's."""
    if not _supported_release():
        return False
    if not callable(getattr(connector_scheduler, SCAN_METHOD, None)):
        return False
    config = getattr(connector_scheduler, "config", None)
    groups = getattr(config, "kv_group_configs", None) or ()
    if len(groups) != 1:
        return False
    group = groups[0]
    if getattr(group, "sliding_window_size_in_chunks", None) is not None:
        return False
    if not (getattr(group, "tokens_per_chunk", 0) or 0) > 0:
        return False
    return not getattr(config, "supports_partial_tail", False)


def _supported_release() -> bool:
    low, high = (versions.release(v) for v in versions.SUPPORTED)
    return low <= versions.release(versions.VLLM_VERSION) <= high


def scan_read_on_this_release(tiering: bool) -> bool:
    """Whether this vLLM release's scan was read and tested: with vLLM's CPU manager alone
    (``versions.SUPPORTED``) or with its tiering manager (``_PROMOTED_ANSWER``). Elsewhere
    kvscope keeps its per-key tap, whatever the scan now answers."""
    return _supported_release() and (not tiering or versions.release()[:2] in _PROMOTED_ANSWER)


def scan_reader(connector_scheduler: Any, manager: Any) -> Callable[[bytes], Any] | None:
    """When a round's lookups can be read from the prefix scan (see the module's doc): a
    function of a key, what the CPU manager's ``lookup`` answers for it now, read from its
    cache policy without changing anything; else None. Only on the releases whose scan
    was read and tested (``versions.SUPPORTED``): another keeps the per-key tap, whatever
    its scan now answers."""
    if not _scan_tells_lookups(connector_scheduler):
        return None
    if secondary_tiers(manager):
        return None
    try:
        stock = _cpu_manager_lookup()
    except ImportError:
        return None
    if getattr(type(manager), "lookup", None) is not stock:
        return None
    policy = getattr(manager, "_policy", None)
    get = getattr(policy, "get", None)
    if not callable(get):
        return None
    hit, pending, miss = LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.MISS

    def result_of(key: bytes) -> Any:  # as CPUOffloadingManager.lookup answers
        row = get(key)
        if row is None:
            return miss
        return hit if getattr(row, "is_ready", True) else pending

    return result_of


# ---- with a secondary tier ---------------------------------------------------------------
# A primary row's place in the reconstruction, by its ref_cnt: >= 0 ready (HIT), -1 being
# written (pending), and this sentinel's -2 for a key the primary tier lacks
_ABSENT_ROW = SimpleNamespace(ref_cnt=-2)
_ABSENT = -2
_REF_CNT = operator.attrgetter("ref_cnt")
# The releases whose tiering lookups were read and tested: what a promotion this lookup
# started answers (0.26: RETRY; 0.33: HIT_PENDING, the row being written; 0.34: as 0.33, its
# prefix scan and the CPU and tiering managers' lookup unchanged)
_PROMOTED_ANSWER = {(0, 26): LookupResult.RETRY, (0, 33): LookupResult.HIT_PENDING,
                    (0, 34): LookupResult.HIT_PENDING}


def promotion_extends_window() -> bool:
    """Whether a promotion a lookup started counts toward a sliding-window group's run of
    hits (it answers HIT_PENDING: 0.33, 0.34): that group's scan, from the prefix's end,
    stops once a window's chunks are hit or being promoted, so a restore from a secondary
    tier promotes its window alone. On 0.26 (RETRY ends the run) it promotes every chunk it
    scans, and on a release not read kvscope says so too (the larger count)."""
    return _PROMOTED_ANSWER.get(versions.release()[:2]) is LookupResult.HIT_PENDING



class TieredReader(NamedTuple):
    """What :func:`tiered_scan_reader` gives: ``read`` a deferred scan's results (see
    there); ``places`` the primary rows' places of some keys (ref_cnt: >= 0 ready, -1
    being written, -2 absent); ``last_answer(key, req_context)`` what the scan's last key,
    which the primary tier lacks, was answered (no refused promotion); ``promoted_retry``:
    a promotion a lookup started answers RETRY (0.26), not HIT_PENDING (0.33);
    ``rows()`` the primary tier's rows, key -> row, a dict in the order the rows were
    inserted (its cache policy's own: read, never changed); ``promotes(key,
    req_context)``: a lookup of ``key`` now, which the primary tier lacks, would ask the
    primary tier for a row to promote it into (a secondary tier has it, promotions are
    not held); ``may_promote(key, req_context)``: it may, once the step's existence
    checks are read (a secondary tier has it or has not answered yet); ``bare_ok``: every
    promotion the primary tier accepts writes its key's row (no 0.26 store threshold), so
    a scan's promotions can be read from the rows (bare_rest.BareRest)."""

    read: Callable[[Sequence[bytes], Any, bool, Collection[bytes], Any,
                    Sequence[tuple[int, int]]], list]
    places: Callable[[Sequence[bytes]], list]
    last_answer: Callable[[bytes, Any], Any]
    promoted_retry: bool
    rows: Callable[[], dict]
    promotes: Callable[[bytes, Any], bool]
    may_promote: Callable[[bytes, Any], bool]
    bare_ok: bool


def _runs(obj: Any, name: str, func: Any) -> bool:
    """``obj.name`` is ``func`` bound to ``obj``: its class's own, no instance attribute over
    it. Read through getattr, never ``vars(obj)``: from CPython 3.11 on that builds the
    object's ``__dict__`` out of its inline values, and every attribute read of the object
    takes a slower path from then on (vLLM's whole prefix scan ran ~15 % slower, every key of
    every scan, with its tiering manager's, tiers' and cache policy's dicts built so)."""
    bound = getattr(obj, name, None)
    return getattr(bound, "__func__", None) is func and getattr(bound, "__self__", None) is obj


def _row_dict(policy: Any) -> Callable[[], dict] | None:
    """vLLM's LRU cache policy's rows, key -> row (0.26 ``blocks``, 0.33 ``chunks``: its
    ``get`` reads them, ``insert`` adds at the end, ``remove`` and ``evict`` delete), read
    each time (a reset may bind a new dict); else None."""
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    if type(policy).get is not LRUCachePolicy.get:
        return None
    name = next((n for n in ("chunks", "blocks")
                 if isinstance(getattr(policy, n, None), dict)), None)
    if name is None:
        return None
    return lambda: getattr(policy, name)


def _rows_reader(policy: Any) -> Callable[[Sequence[bytes]], list] | None:
    """The primary tier's rows of some keys (``_ABSENT_ROW`` where none), read from its
    cache policy: vLLM's LRU policy's dict in C (``dict.get`` over ``map``), else its
    ``get`` per key."""
    get = getattr(policy, "get", None)
    if not callable(get):
        return None
    rows = _row_dict(policy)
    if rows is not None:
        return lambda keys: list(map(rows().get, keys, repeat(_ABSENT_ROW, len(keys))))
    return lambda keys: [row if (row := get(k)) is not None else _ABSENT_ROW for k in keys]


def _fs_tier_states(tiers: list[Any]) -> list[dict] | None:
    """Each secondary tier's async existence checks (key -> state, ``result`` True, False
    or None: not answered yet), where each is vLLM's fs tier answering from them
    (``FileSystemTierManager.lookup`` over ``AsyncLookupManager.lookup``, neither
    overridden); else None."""
    try:
        from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
        from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager
    except ImportError:
        return None
    states = []
    for tier in tiers:
        lookups = getattr(tier, "_lookup_manager", None)
        state = getattr(lookups, "_lookup_state", None)
        if (not _runs(tier, "lookup", FileSystemTierManager.lookup)
                or not _runs(lookups, "lookup", AsyncLookupManager.lookup)
                or not isinstance(state, dict)):
            return None
        states.append(state)
    return states


def tiered_scan_reader(connector_scheduler: Any, manager: Any) -> TieredReader | None:
    """Where a deferred prefix scan's lookups can be read from vLLM's tiering manager right
    after the scan (still inside vLLM's call): a function of the keys the scan consumed, the
    request's context, whether the scan stopped before the end of its keys, the keys the
    primary tier's promotions of this scan wrote rows for (``prepare_write``), what they
    evicted (kvscope's flat ``Evictions``: all the keys in ``keys``, ``(index, keys)`` pairs
    when iterated) and the ``(index, keys)`` refused, that returns
    the results ``TieringOffloadingManager.lookup`` gave them (``TieredReader.read``, with
    the parts it is made of: scan_cache.py counts a request's scans from them); else None.

    Each lookup asks the primary tier (HIT: a ready row; HIT_PENDING: a row being written),
    then, for a key the primary lacks, each secondary tier: HIT starts a promotion (a
    primary row being written: RETRY on 0.26, HIT_PENDING on 0.33; no row: MISS), RETRY
    (its existence check not answered), MISS. The scan stops at the first MISS. Nothing but
    the lookups changes those states during the scan (0.33 holds the manager's lock for the
    whole schedule; vLLM polls finished jobs before the first primary lookup of a step), so:
    a ready row was a HIT, a row being written a HIT_PENDING or the promotion's answer
    (written this scan), an absent key a RETRY (its secondary tiers had not answered yet),
    except the key that stopped the scan (MISS), a key found and then evicted by a later
    promotion of the scan (HIT), and the last of the keys when the scan reached it: its
    answer is the secondary tiers' (their existence checks' results, 0.33's held promotions
    and each request's tier filter). Only vLLM's own tiering manager, CPU primary tier and
    fs tiers, on the releases read (0.26, 0.33, 0.34)."""
    promoted_answer = _PROMOTED_ANSWER.get(versions.release()[:2])
    if promoted_answer is None or not _scan_tells_lookups(connector_scheduler):
        return None
    tiers = secondary_tiers(manager)
    if not tiers:
        return None
    try:
        from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
        stock = _cpu_manager_lookup()
    except ImportError:
        return None
    primary = getattr(manager, "primary_tier", None)
    if (not _runs(manager, "lookup", TieringOffloadingManager.lookup) or primary is None
            or not _runs(primary, "lookup", stock)):
        return None
    policy = getattr(primary, "_policy", None)
    rows_of, row_dict = _rows_reader(policy), _row_dict(policy)
    states = _fs_tier_states(tiers)
    if rows_of is None or row_dict is None or states is None:
        return None
    hit, pending, retry, miss = (LookupResult.HIT, LookupResult.HIT_PENDING,
                                 LookupResult.RETRY, LookupResult.MISS)
    by_ref_cnt = {-1: pending, _ABSENT: retry}  # else (ready) HIT
    tier_states = list(zip(tiers, states))

    def allowed(req_context: Any) -> Any:
        """The existence checks of each secondary tier the request may load from (0.33's
        tier filter), in the tiering manager's order."""
        tier_filter = getattr(req_context, "load_tier_filter", None)  # 0.33
        return (state for tier, state in tier_states
                if tier_filter is None or tier_filter.allows(tier.medium, tier.locality))

    def secondary(key: bytes, req_context: Any) -> Any:
        """What the secondary tiers answer a key the primary tier lacks: HIT (a tier has
        it: a promotion is asked for), RETRY (one has not answered yet) or MISS, with
        0.33's held promotions (MISS, no tier asked) and each request's tier filter."""
        if getattr(manager, "_promotions_held", False):  # 0.33's hold: MISS
            return miss
        any_retry = False
        for state in allowed(req_context):
            found = getattr(state.get(key), "result", None)
            if found is True:
                return hit
            if found is None:
                any_retry = True
        return retry if any_retry else miss

    def last_absent(key: bytes, req_context: Any, refused: bool) -> Any:
        """The answer to the scan's last key, which the primary tier lacks."""
        if refused:
            return miss
        answer = secondary(key, req_context)
        # a promotion: its row (not absent) or refused (MISS)
        return miss if answer is hit else answer

    def promotes(key: bytes, req_context: Any) -> bool:
        return key not in row_dict() and secondary(key, req_context) is hit

    def may_promote(key: bytes, req_context: Any) -> bool:
        if key in row_dict() or getattr(manager, "_promotions_held", False):
            return False
        return any(found is not None and found.result is not False
                   for found in (state.get(key) for state in allowed(req_context)))

    def read(keys: Sequence[bytes], req_context: Any, stopped: bool,
             promoted: Collection[bytes], evicted: Any,
             refused: Sequence[tuple[int, int]]) -> list:
        m = len(keys)
        if not m:
            return []
        ref_cnts = list(map(_REF_CNT, rows_of(keys)))
        places = ref_cnts
        if promoted and promoted_answer is retry:  # rows this scan's promotions wrote: -2
            places = list(map(operator.sub, ref_cnts, map(set(promoted).__contains__, keys)))
        if places.count(-1) == m:  # every row being written (a held restore's rounds)
            results = [pending] * m
        else:
            results = list(map(by_ref_cnt.get, places, repeat(hit, m)))
        # found (ready) and evicted by a later promotion of this scan: a HIT. A long
        # restore's promotions evict other prompts' rows: a C-level test first
        if evicted and not set(evicted.keys).isdisjoint(keys):
            at = dict(zip(keys, range(m)))
            for i, gone in evicted:
                for key in gone:
                    j = at.get(key)
                    if j is not None and j < i and ref_cnts[j] == _ABSENT:
                        results[j] = hit
        if stopped:
            results[-1] = miss
        elif ref_cnts[-1] == _ABSENT:
            results[-1] = last_absent(keys[-1], req_context,
                                      any(i == m - 1 for i, _ in refused))
        return results

    def places(keys: Sequence[bytes]) -> list:
        return list(map(_REF_CNT, rows_of(keys)))

    return TieredReader(read, places, lambda key, ctx: last_absent(key, ctx, False),
                        promoted_answer is retry, row_dict, promotes, may_promote,
                        getattr(primary, "counts", None) is None)
