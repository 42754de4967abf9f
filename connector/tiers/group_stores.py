"""Stores per KV group: which group's keys the store jobs write, and which the primary tier holds.

A model with several KV groups stores one key per chunk of each group, and a group's chunk is
its block size times ``blocks_per_chunk`` tokens: a sub-block group (or a drafter's) stores
many times the keys of the others per token. It can fill the CPU primary tier (and, through
it, the disk tier) with its own keys while another group's chunks reach no tier, and a
restore needs every group (vLLM's cross-group AND): kv-diagnose's ``tier_flooded_by_group``.

Work on vLLM's scheduler thread: none beyond the store tap's one journal event per store job
(``manager_proxy._store_tap``: the job's keys, the keys it stores and the keys it evicts, each
a tuple, C-level copies; the stored tuple is the keys' own when the job stores every key). On
the aggregator thread, per store job: with one KV group, lengths; with several, one C-level
pass per tuple (``Counter.update`` over the keys' group suffixes), never a Python frame per
key. The primary tier's keys per group are counted from its cache policy when the gauges
refresh (every ``flush_interval_s``), in slices between which the aggregator thread lets vLLM's
thread have the GIL; with one group, the policy's length alone (no copy).
"""

from __future__ import annotations

import operator
import threading
import time
from collections import Counter
from typing import Any

from kvscope.connector import compat
from kvscope.exporters import signals
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import StoreKeyResult

_SUFFIX = operator.itemgetter(slice(-compat.GROUP_SUFFIX_BYTES, None))
# Keys counted between two GIL releases when the primary tier's keys are counted per group
# (~0.2 ms each on a slow core: vLLM's thread waits at most that long for the GIL).
SLICE = 2048
_RESULTS = (StoreKeyResult.STORED.value, StoreKeyResult.HELD.value,
            StoreKeyResult.NO_SPACE.value)


def suffix_of(group: int) -> bytes:
    return group.to_bytes(compat.GROUP_SUFFIX_BYTES, "big")


class GroupStores:
    """Per-group tallies of store jobs (aggregator thread) and the primary tier's keys."""

    def __init__(self, *, recorder: Recorder, manager: Any, chunk_tokens: dict[int, int],
                 row_bytes: int) -> None:
        self.rec = recorder
        self.manager = manager
        self.row_bytes = row_bytes
        groups = sorted(chunk_tokens) or [0]
        # group suffix -> (label, tokens per chunk)
        self.groups = {suffix_of(g): (str(g), chunk_tokens.get(g, 0)) for g in groups}
        # one KV group: every key is that group's, counted by lengths alone
        self.only = next(iter(self.groups)) if len(self.groups) == 1 else None
        # keys since the last flush, by group suffix: stored, held, refused, evicted
        self._stored: Counter[bytes] = Counter()
        self._held: Counter[bytes] = Counter()
        self._refused: Counter[bytes] = Counter()
        self._evicted: Counter[bytes] = Counter()
        self.owner: threading.Thread | None = None  # the thread that may yield the GIL

    def declare(self) -> None:
        labels = [(label,) for label, _ in self.groups.values()]
        self.rec.declare(signals.STORE_KEYS, *[(g, r) for (g,) in labels for r in _RESULTS])
        for metric in (signals.STORE_BYTES, signals.STORE_TOKENS, signals.EVICTED_KEYS):
            self.rec.declare(metric, *labels)

    # ---- store jobs (aggregator thread, journal order) ----------------------------------------
    def refused(self, keys: tuple[bytes, ...]) -> None:
        if self.only is not None:
            self._refused[self.only] += len(keys)
        else:
            self._refused.update(map(_SUFFIX, keys))

    def prepared(self, keys: tuple[bytes, ...], stored: tuple[bytes, ...],
                 evicted: tuple[bytes, ...]) -> None:
        """A job of ``keys`` stored ``stored`` (the rest were held) and evicted ``evicted``."""
        only = self.only
        if only is not None:
            self._stored[only] += len(stored)
            self._held[only] += len(keys) - len(stored)
            if evicted:
                self._evicted[only] += len(evicted)
            return
        if stored is keys:  # every key new (the store tap passes the same tuple)
            self._stored.update(map(_SUFFIX, keys))
        else:
            new = Counter(map(_SUFFIX, stored))
            self._stored.update(new)
            every = Counter(map(_SUFFIX, keys))
            every.subtract(new)
            self._held.update(every)
        if evicted:
            self._evicted.update(map(_SUFFIX, evicted))

    def flush(self) -> None:
        """The keys tallied since the last flush into the recorder (aggregator)."""
        stored, held, refused, evicted = self._stored, self._held, self._refused, self._evicted
        if not (stored or held or refused or evicted):
            return
        self._stored, self._held = Counter(), Counter()
        self._refused, self._evicted = Counter(), Counter()
        rec, groups, row_bytes = self.rec, self.groups, self.row_bytes
        for suffix in stored.keys() | held.keys() | refused.keys() | evicted.keys():
            label, chunk_tokens = groups.get(suffix) or (str(compat.group_of_suffix(suffix)), 0)
            for result, counts in zip(_RESULTS, (stored, held, refused)):
                if counts[suffix]:
                    rec.inc(signals.STORE_KEYS, (label, result), counts[suffix])
            if stored[suffix]:
                rec.inc(signals.STORE_BYTES, (label,), stored[suffix] * row_bytes)
                rec.inc(signals.STORE_TOKENS, (label,), stored[suffix] * chunk_tokens)
            if evicted[suffix]:
                rec.inc(signals.EVICTED_KEYS, (label,), evicted[suffix])

    # ---- the primary tier's keys (with the gauges) ---------------------------------------
    def refresh_gauges(self) -> None:
        """``kvscope_primary_keys`` per group, from the primary tier's cache policy."""
        if self.only is not None:
            counts = {self.only: compat.primary_key_count(self.manager)}
        else:
            keys = compat.primary_keys(self.manager)
            counts = Counter()
            yields = threading.current_thread() is self.owner
            for i in range(0, len(keys), SLICE):
                counts.update(map(_SUFFIX, keys[i:i + SLICE]))
                if yields:
                    time.sleep(0)  # the GIL to vLLM's thread between slices
        self.rec.set_many([((signals.PRIMARY_KEYS, (label,)), counts.get(suffix, 0))
                           for suffix, (label, _) in self.groups.items()])
