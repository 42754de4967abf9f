"""Integrity of promoted rows, both sides: digests, verification, refusal, quarantine.

A promotion (disk -> CPU) writes whole rows into the scheduler host's shared
region; on a multi-node TP deployment the other nodes' regions never see those
bytes. So:

* scheduler side (:class:`PromotedRows`): when a promotion completes, digest each
  rank's slot of its rows; when vLLM prepares a load of such rows, attach the
  expected digests to the load spec; when a rank refuses the load (its GPU
  blocks come back as ``invalid_block_ids``), quarantine the keys so the
  recompute vLLM then schedules does not look them up, load and refuse again
  (0.33 with several KV groups: the request comes back as a failed receive);
* worker side (:func:`mismatched_rows`): before the load, each rank digests its
  own slot of the same rows in its own mapping and compares.

Only rows a promotion filled are checked: the rest were written by the ranks
themselves. Only ranks that do not map the scheduler's own region file are checked
(``checksum_scope`` ``unshared``, the default; shared_region.py): the others read the
promotion's bytes themselves. Everything here runs per promotion / per load job, never
per key looked up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvscope.connector import compat
from kvscope.connector.compat import load_failures
from kvscope.connector.integrity.checksums import ChecksumPolicy, Digester
from kvscope.connector.integrity.shared_region import SharedRanks
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import ErrorSite


class PromotedRows:
    """Scheduler side: expected digests of promoted rows, refused loads, quarantine."""

    def __init__(self, *, recorder: Recorder, policy: str, view: memoryview | None,
                 geometry: compat.RegionGeometry | None,
                 digester: Digester | None = None,
                 ranks: SharedRanks | None = None) -> None:
        self.rec = recorder
        self.policy = policy
        # the ranks digest with the same algorithm (WorkerProxy, from the same settings)
        self.digester = digester or Digester()
        self.view = view  # the scheduler's view of the primary tier (tiering only)
        self.geometry = geometry
        # which ranks' slots to digest (None: every rank's)
        self.ranks = ranks
        # key -> (row, per-rank digests; None for a rank sharing the scheduler's file) of
        # rows filled by a completed promotion
        self.expected: dict[bytes, tuple[int, tuple[int | None, ...]]] = {}
        # Refused loads: a rank's copy of these keys' rows differs from the
        # scheduler host's. Without this, vLLM's recompute would look the same
        # keys up, load and be refused again, forever. The manager proxy answers
        # MISS for them. Insertion-ordered (oldest trimmed); never rebound.
        self.quarantine: dict[bytes, None] = {}
        self._load_keys: dict[int, list[bytes]] = {}  # id(load spec) -> keys, until meta
        # job -> (GPU blocks, keys, request id)
        self._load_jobs: dict[int, tuple[set[int], list[bytes], str | None]] = {}
        self._guard = recorder.guard(ErrorSite.CHECKSUM)

    @property
    def active(self) -> bool:
        return (self.policy != ChecksumPolicy.OFF and self.view is not None
                and self.geometry is not None)

    def close(self) -> None:
        """Drop the buffer export so vLLM can close the primary tier's mmap."""
        if self.view is not None:
            self.view.release()
            self.view = None
        self.digester.close()

    # ---- promotions --------------------------------------------------------------------
    def digest_promoted(self, keys: list[bytes], rows: list[int]) -> None:
        if not self.active:
            return
        g, view = self.geometry, self.view
        with self._guard:
            n, size = g.world_size, g.slot_size
            ranks = self.ranks.to_digest() if self.ranks is not None else tuple(range(n))
            if not ranks:  # every rank reads these very bytes: nothing to compare
                return
            k = len(ranks)
            offsets = [g.slot_offset(int(row), r) for row in rows for r in ranks]
            # the promotion's rows, over a few threads
            digests = self.digester.many([view[o:o + size] for o in offsets])
            # a row's digests, one per rank in rank order (None: a rank not digested)
            pad = [None] * n
            for i, (key, row) in enumerate(zip(keys, rows)):
                per = pad[:]
                for r, d in zip(ranks, digests[i * k:(i + 1) * k]):
                    per[r] = d
                self.expected[key] = (row, tuple(per))
            if len(self.expected) > 2 * g.rows:  # bound: at most rows are live anyway
                for stale in list(self.expected)[: len(self.expected) - 2 * g.rows]:
                    del self.expected[stale]

    def forget(self, keys) -> None:
        """Rows rewritten or evicted: their digests and quarantine no longer apply."""
        if self.expected or self.quarantine:
            for key in keys or ():
                self.expected.pop(key, None)
                self.quarantine.pop(key, None)

    # ---- loads -------------------------------------------------------------------------
    def on_prepare_load(self, keys, spec) -> None:
        if not self.expected:
            return
        with self._guard:
            expected = {}
            for key, row in zip(keys, compat.spec_rows(spec)):
                hit = self.expected.get(key)
                if hit is not None and hit[0] == row:
                    expected[row] = hit[1]
            if expected:  # only checked loads can be refused: remember their keys
                setattr(spec, compat.EXPECTED_DIGESTS_ATTR, expected)
                self._load_keys[id(spec)] = list(keys)

    def on_meta(self, meta: Any) -> None:
        """Remember which keys each checked load job covers (for refusals)."""
        if not self._load_keys:
            return
        with self._guard:
            for job_id, job in (getattr(meta, "load_jobs", None) or {}).items():
                keys = self._load_keys.pop(id(job.src_spec), None)
                if keys is not None:
                    self._load_jobs[job_id] = (set(compat.spec_rows(job.dst_spec)), keys,
                                               load_failures.load_job_request(job))
            self._load_keys.clear()

    def on_connector_output(self, output: Any, live_jobs: Callable[[], set[int]]) -> None:
        """Quarantine the keys of loads a rank refused; forget finished load jobs."""
        if not self._load_jobs:
            return
        with self._guard:
            invalid = set(getattr(output, "invalid_block_ids", None) or ())
            failed = load_failures.failed_requests(output)  # 0.33, several KV groups
            if invalid or failed:
                for job_id, (blocks, keys, req_id) in list(self._load_jobs.items()):
                    if blocks & invalid or req_id in failed:
                        self.quarantine.update(dict.fromkeys(keys))
                        del self._load_jobs[job_id]
            live = live_jobs()
            for job_id in [j for j in self._load_jobs if j not in live]:
                del self._load_jobs[job_id]
            limit = 2 * (self.geometry.rows if self.geometry else 1024)
            for stale in list(self.quarantine)[: max(len(self.quarantine) - limit, 0)]:
                del self.quarantine[stale]


def mismatched_rows(view: memoryview, geometry: compat.RegionGeometry, rank: int,
                    expected: dict[int, tuple[int | None, ...]],
                    digester: Digester) -> tuple[int, int]:
    """Worker side: (rows compared, rows whose slot for ``rank`` differs from the
    scheduler's digest). A row without a digest for ``rank`` (the rank maps the scheduler's
    own file) is not compared."""
    rows = [(row, d[rank]) for row, d in expected.items() if d[rank] is not None]
    size = geometry.slot_size
    offsets = [geometry.slot_offset(int(row), rank) for row, _ in rows]
    got = digester.many([view[o:o + size] for o in offsets])  # the load's rows, a few threads
    return len(rows), sum(1 for (_, want), digest in zip(rows, got) if digest != want)
