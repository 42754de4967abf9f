"""Restore coverage of one ended lookup round: what the tiers held vs what was offered.

vLLM's prefix scan stops at a group's first MISS, so the lookup results alone
say where the offer stopped, not how much more the tiers hold. The common case
needs no more: a MISS that no tier could answer ends the stored prefix too. Only
when the MISS was a promotion refused for want of a primary row (the rare path)
is the rest of the prefix probed, read only (``compat.held_prefix``: the cache
policy's dict and the fs tier's existence-check results; no I/O, no promotion).

A MISS no tier could answer is told apart once more: a key whose store job the
primary tier refused for lack of space (``store_refusals``) was never stored
although the engine tried (``store_refused``); any other is ``not_stored``.

Called once per ended round (hit, miss or vetoed), never per key.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvscope.connector import compat
from kvscope.exporters.signals import ShortReason, Verdict


class MissCause(Enum):
    ABSENT = 0  # no tier holds the key (as far as vLLM can tell now)
    REFUSED = 1  # a tier holds it; its promotion found no free primary row
    QUARANTINED = 2  # kvscope answered MISS (a rank refused these bytes)


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is slower
class Coverage:
    offered: int  # tokens vLLM was offered to load
    held: int  # tokens of the prefix the tiers held (cross-group AND), >= offered
    want: int  # tokens of the request's whole loadable prefix (full chunks)
    reason: ShortReason | None  # why the offer stopped short of ``want``; None: it did not
    refused: bool  # some group's scan ended at a refused promotion
    rows_needed: int  # rows (chunk keys over all groups) the held prefix pins at once
    # the KV group whose scan stopped the offer (``reason`` set): the group whose stored
    # prefix ends there (not_stored, store_refused), whose promotion found no free row
    # (row_ceiling), whose miss vetoed the others (group_veto); -1: none told (or not short)
    group: int = -1


def group_suffixes(groups: list[tuple[int, bool]]) -> list[tuple[bytes, int, bool]]:
    """(key suffix, tokens per chunk, sliding window) per KV group, in group order."""
    return [(g.to_bytes(compat.GROUP_SUFFIX_BYTES, "big"), tpc, sw)
            for g, (tpc, sw) in enumerate(groups)]


_REFUSED, _QUARANTINED = MissCause.REFUSED, MissCause.QUARANTINED
_VETOED = Verdict.VETOED


def _index(keys: list[bytes], key: bytes, start: int) -> int:
    try:
        return keys.index(key, start)
    except ValueError:
        return start


def judge(*, first_miss: dict[bytes, tuple[bytes, MissCause]], scanned: set[bytes],
          verdict: Verdict, offered: int, num_computed: int,
          groups: list[tuple[bytes, int, bool]], keys_by_group: list[list[bytes]],
          manager: Any, refused_stores: Container[bytes] = ()) -> Coverage | None:
    """``first_miss``: group suffix -> (first key answered MISS, why); ``scanned``: group
    suffixes looked up this round (read only when a refusal cut it); ``groups``: (key
    suffix, tokens per chunk, sliding window) of each KV group (:func:`group_suffixes`);
    ``refused_stores``: keys whose store job was refused for lack of space.

    Once per ended round: plain loops, no generators (it holds the aggregator's lock, on
    its thread or, for a round with rare events or a span, on vLLM's scheduler thread).
    """
    refused = False
    for _, cause in first_miss.values():
        if cause is _REFUSED:
            refused = True
            break
    want_end = held_end = -1  # -1: no group yet
    quarantined = sw_miss = False
    starts: list[tuple[int, int]] = []  # (tokens per chunk, first chunk not computed)
    # (tokens, key, group) where a full group's scan found nothing
    absent: list[tuple[int, bytes, int]] = []
    # the group whose miss came first (tokens), whose refused promotion came first, and
    # the sliding-window group that missed: which group stopped the offer, by reason
    first_group = refused_group = sw_group = -1
    first_at = refused_at = -1
    for gi, ((suffix, tpc, sw), keys) in enumerate(zip(groups, keys_by_group, strict=False)):
        if tpc <= 0:
            continue
        n = len(keys)
        if want_end < 0 or n * tpc < want_end:
            want_end = n * tpc
        start = num_computed // tpc
        if start > n:
            start = n
        starts.append((tpc, start))
        miss = first_miss.get(suffix)
        if miss is None:
            # Scanned without a MISS: held to its end. Not scanned: vLLM returned
            # before reaching it; only worth probing when a refusal cut the round.
            end = n
            if refused and suffix not in scanned:
                end = start + compat.held_prefix(manager, keys[start:])
        else:
            key, cause = miss
            end = _index(keys, key, start)
            at = end * tpc
            if not sw and (first_at < 0 or at < first_at):  # a window's miss is no position
                first_at, first_group = at, gi
            if cause is _REFUSED:
                if refused_at < 0 or at < refused_at:
                    refused_at, refused_group = at, gi
                end += compat.held_prefix(manager, keys[end:])
            elif cause is _QUARANTINED:
                quarantined = True
            elif not sw:
                absent.append((at, key, gi))
            if sw and sw_group < 0:
                sw_group = gi
        if sw:  # a window, not a prefix: it vetoes, it does not bound the held prefix
            sw_miss = sw_miss or miss is not None
            continue
        if held_end < 0 or end * tpc < held_end:
            held_end = end * tpc
    if want_end < 0:
        return None
    if held_end < 0 or held_end > want_end:
        held_end = want_end
    want = want_end - num_computed
    if want < 0:
        want = 0
    held = held_end - num_computed
    if held < offered:
        held = offered
    if held < 0:
        held = 0
    rows_needed = 0
    for tpc, start in starts:
        if held_end // tpc > start:
            rows_needed += held_end // tpc - start
    group = first_group
    if offered >= want:
        reason, group = None, -1
    elif held <= offered:
        # the stored prefix ends where a full group's scan found nothing: was that
        # chunk's store refused (stored only in part), or never tried?
        reason = ShortReason.NOT_STORED
        ends = False  # some group's stored prefix ends there: the first such names it
        for end, key, gi in absent:
            if end == held_end:
                if key in refused_stores:
                    reason, group = ShortReason.STORE_REFUSED, gi
                    break
                if not ends:
                    ends, group = True, gi
    elif verdict is _VETOED or (sw_miss and offered == 0):
        reason = ShortReason.GROUP_VETO
        if sw_miss:
            group = sw_group
    elif refused:
        reason, group = ShortReason.ROW_CEILING, refused_group
    elif quarantined:
        reason = ShortReason.OTHER
    elif offered > 0:
        reason = ShortReason.LOAD_CAP
    else:
        reason = ShortReason.OTHER
    return Coverage(offered, held, want, reason, refused, rows_needed, group)


_NOT_STORED, _LOAD_CAP, _OTHER, _GROUP_VETO = (ShortReason.NOT_STORED, ShortReason.LOAD_CAP,
                                               ShortReason.OTHER, ShortReason.GROUP_VETO)
_STORE_REFUSED = ShortReason.STORE_REFUSED


def judge_plain_single(keys: list[bytes], tpc: int, first_miss_key: bytes | None,
                       verdict: Verdict, offered: int, num_computed: int,
                       refused_stores: Container[bytes] = ()) -> Coverage:
    """:func:`judge` for the common round: one KV group, full attention (``tpc`` > 0,
    no sliding window), no refused promotion and no quarantined key in the round.
    ``first_miss_key``: the round's first key answered MISS (None: no MISS). The same
    Coverage as judge() (tests/unit/test_coverage_plain.py compares them), without
    its per-group dicts and loops: this runs for most rounds (on the aggregator thread)."""
    n = len(keys)
    want_end = n * tpc
    start = num_computed // tpc
    if start > n:
        start = n
    end = n if first_miss_key is None else _index(keys, first_miss_key, start)
    held_end = end * tpc
    want = want_end - num_computed
    if want < 0:
        want = 0
    held = held_end - num_computed
    if held < offered:
        held = offered
    if held < 0:
        held = 0
    rows_needed = end - start if end > start else 0
    if offered >= want:
        reason = None
    elif held <= offered:  # the stored prefix ends at the MISS (held_end is end * tpc)
        reason = (_STORE_REFUSED if first_miss_key is not None
                  and first_miss_key in refused_stores else _NOT_STORED)
    elif verdict is _VETOED:
        reason = _GROUP_VETO
    elif offered > 0:
        reason = _LOAD_CAP
    else:
        reason = _OTHER
    # the only group stopped the offer, where a MISS of it did (judge()'s rule)
    return Coverage(offered, held, want, reason, False, rows_needed,
                    -1 if reason is None or first_miss_key is None else 0)
