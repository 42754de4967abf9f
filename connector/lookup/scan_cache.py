"""A request's deferred scans counted per change, not per key (the tiering scan tap's fast path).

A prompt restored from the fs tier is looked up again, key by key, on every step its
restore is deferred (a 131k-token prompt: ~8,190 keys a step). Reading each such scan's
lookups from the tiers' state (compat.tiered_scan_reader) took a few C-level passes per key
per step: on the H200, ~0.17 s of the scheduler thread per 131k-token restore, which is the
engine's critical path while it restores.

What a deferred scan's lookups answer is decided by each key's primary row: absent, being
written, or ready (compat/prefix_scan.py). Between two scans those change only where the
primary tier allocated or evicted rows (``prepare_store`` / ``prepare_write``), finished
writing them (``complete_store`` / ``complete_write``: ready, or removed on failure) or
was reset; the primary tier's taps (tiers/taps.py) append the keys of each such call to
:class:`PrimaryChanges`. So a request's row states are kept from its last deferred scan
(:class:`DeferredScans`) and only the keys changed since are read again; the round's counts
are then two ``list.count`` over the kept states, and nothing per key is written to the
lookup log. Any doubt (another key list, a reset, changes past the log's bound) reads
every row again, as the first scan of a request does.
"""

from __future__ import annotations

from typing import Any

from kvscope.connector import compat

_ABSENT, _WRITING = -2, -1  # a row's place (compat.prefix_scan): else ref_cnt >= 0, ready


class PrimaryChanges:
    """Keys whose primary row may have changed place, in order (scheduler thread: every
    primary-tier call that changes rows runs there). ``epoch`` counts resets: a reset
    tier, or a log that passed ``limit`` keys, invalidates every kept scan. The per-job taps
    (tiers/taps.py) extend ``keys`` themselves (a C-level extend, no frame) and reset past
    ``limit``; they are set by ``watch()``, which the first kept scan calls (``watched``):
    an engine that never defers a long scan pays no frame per store job for a log nobody
    reads."""

    __slots__ = ("keys", "epoch", "limit", "watched", "watch")

    def __init__(self, limit: int = 1 << 17) -> None:
        self.keys: list[bytes] = []
        self.epoch = 0
        self.limit = limit
        self.watched = False
        self.watch = self.mark_watched  # the taps' owner sets its own (tiers/taps.py)

    def mark_watched(self) -> None:
        self.watched = True

    def reset(self) -> None:
        self.keys.clear()
        self.epoch += 1


class DeferredScans:
    """The row states of the last deferred scan of up to ``size`` requests (a long restore
    is a handful at once), each kept with the change log's length at its read."""

    __slots__ = ("changes", "rows", "size", "_kept")

    def __init__(self, changes: PrimaryChanges, rows: Any, size: int = 8) -> None:
        """``rows``: a list of keys -> their primary rows' places (compat's TieredReader)."""
        self.changes = changes
        self.rows = rows
        self.size = size
        # id(req_context) -> [req_context, total, first key, last key, epoch, mark,
        #                     places, key -> index (built at the first change),
        #                     places absent, places being written]
        self._kept: dict[int, list] = {}

    def places(self, keys: list[bytes], req_context: Any) -> tuple[list[int], int, int]:
        """Each key's primary row place now (``keys``: one request's whole scan), and how
        many of them are absent and being written (kept up to date per change, so a
        deferred round is not two passes over its ~8,190 places a step)."""
        changes, total = self.changes, len(keys)
        kept = self._kept.get(id(req_context))
        if (kept is None or kept[0] is not req_context or kept[1] != total
                or kept[4] != changes.epoch or kept[2] != keys[0] or kept[3] != keys[-1]):
            # the last key's hash chains the whole prefix: same ends, same keys
            places = self.rows(keys)
            kept = self._keep(keys, req_context, places, places.count(_ABSENT),
                              places.count(_WRITING))
            return places, kept[8], kept[9]
        log, mark, places = changes.keys, kept[5], kept[6]
        if len(log) > mark:
            index = kept[7]
            if index is None:
                index = kept[7] = dict(zip(keys, range(total)))
            at = [j for j in map(index.get, log[mark:]) if j is not None]
            if at:
                absent, writing = kept[8], kept[9]
                for j, place in zip(at, self.rows([keys[j] for j in at])):
                    old = places[j]
                    if old != place:
                        absent += (place == _ABSENT) - (old == _ABSENT)
                        writing += (place == _WRITING) - (old == _WRITING)
                        places[j] = place
                kept[8], kept[9] = absent, writing
            kept[5] = len(log)
        return places, kept[8], kept[9]

    def written(self, keys: list[bytes], req_context: Any) -> None:
        """A scan of the request's whole ``keys`` promoted each of them (a restore from disk's
        promoting scan): every row is being written now, kept so without reading them (the
        next deferred scan would read all ~8,190 again)."""
        self._keep(keys, req_context, [_WRITING] * len(keys), 0, len(keys))

    def _keep(self, keys: list[bytes], req_context: Any, places: list[int], absent: int,
              writing: int) -> list:
        changes = self.changes
        if not changes.watched:  # the per-job taps from now on: the log holds every change
            changes.watch()      # after the mark below
        kept = [req_context, len(keys), keys[0], keys[-1], changes.epoch, len(changes.keys),
                places, None, absent, writing]
        kept_all = self._kept
        kept_all.pop(id(req_context), None)
        if len(kept_all) >= self.size:
            del kept_all[next(iter(kept_all))]
        kept_all[id(req_context)] = kept
        return kept


def count(places: list[int], m: int, promoted: int, stopped: bool,
          last_missed: Any, totals: tuple[int, int] | None = None) -> tuple[int, int, int, int]:
    """(HIT, HIT_PENDING, RETRY, MISS) of a deferred scan that consumed ``m`` keys, from the
    places of its keys: being written HIT_PENDING, absent RETRY, ready HIT; ``promoted``
    rows this scan's promotions wrote answered RETRY (0.26; 0.33: 0, they answer
    HIT_PENDING); the last key MISS where the scan stopped there, or where it is absent and
    ``last_missed()`` says its secondary tiers answered MISS. ``totals``: (absent, being
    written) over all of ``places`` where they are known (DeferredScans)."""
    if totals is not None and m == len(places):
        seg = places
        absent, writing = totals
    else:
        seg = places if m == len(places) else places[:m]
        absent, writing = seg.count(_ABSENT), seg.count(_WRITING)
    pending, retry = writing - promoted, absent + promoted
    hit, miss = m - pending - retry, 0
    last = seg[-1]
    if stopped:  # the scan's last lookup was its MISS (never a promotion: that is RETRY)
        miss = 1
        if last == _ABSENT:
            retry -= 1
        elif last == _WRITING:
            pending -= 1
        else:
            hit -= 1
    elif last == _ABSENT and last_missed() is compat.MISS:
        retry -= 1
        miss = 1
    return hit, pending, retry, miss
