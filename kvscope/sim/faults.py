"""Test-only fault injection: OFF unless ``KVSCOPE_FAULT_FILE`` is set. Never use in production.

kvscope exists to tell offload failures apart; the fault campaign
(``benchmarks/gpu_campaign.py``) and the CPU tests cause those failures on
purpose, on a real engine, so the signals, alerts and kv-diagnose can be
judged against a known cause. Without the environment variable every hook
below returns at once and changes nothing.

The variable names a JSON file that the campaign driver rewrites while the
engine runs; each process (scheduler, every rank) re-reads it at most every
``POLL_S`` seconds, so a fault is switched on and off at run time::

    {"fault": "flip_promoted", "rank": 1}     # or {"fault": null}: clear

Faults (``rank``: the one rank the fault hits):

* ``flip_promoted``  - after a disk->CPU promotion completes (and kvscope has
  digested it), flip bytes in ``rank``'s slot of the promoted rows: memory
  corrupted between promotion and load;
* ``drop_promotion`` - a promotion never reaches ``rank``: its slot of the
  promoted rows keeps what it held before the promotion;
* ``stall_reads`` / ``stall_writes`` - the fs tier's reads (promotions) or
  writes (cascades) make no progress: jobs are held before the tier's thread
  pool and handed to it once the fault clears;
* ``withhold_store`` - ``rank``'s worker completes its GPU->CPU store jobs but
  does not report them until the fault clears (a lost completion);
* ``lose_rounds`` - kvscope's own judging of a lookup round raises (a kvscope bug):
  the round is counted in ``kvscope_telemetry_errors_total`` and missing from every
  round series, as a real bug there would leave it (``rank`` is not read).
* ``lose_finishes`` - kvscope's recording of a request's end raises (a kvscope bug), on
  both threads: the scheduler thread's hook (after journaling the end, before the
  request leaves kvscope's live set) and the aggregator's handler (the request keeps its
  state): counted in ``kvscope_telemetry_errors_total`` (``rank`` is not read).

* ``leak_blocks`` - every request that finishes leaves one reference on each of its GPU
  blocks in vLLM's block pool that nothing releases (a connector that pins a request's
  blocks and never unpins them): the engine idles holding them (``rank`` is not read).

Structural fault (fixed at start-up, not switchable): :class:`OwnRegionTieringSpec`
(``spec_name`` ``OwnRegionTieringSpec``, ``spec_module_path`` this module) lets the
ranks in ``kv_connector_extra_config["kvscope_test_own_region_ranks"]`` map an offload
region of their own, as a second node's ``/dev/shm`` would be.

The fs tier's directory removed and its disk full need no hook: the driver
removes the directory or fills the tier's small tmpfs.

Hooks wrap instances (instance-attribute shadowing, as kvscope's own taps do). The
served connector has none: :class:`~kvscope.sim.fault_connector.FaultInjectingConnector`,
the subclass the CPU harness and the fault campaigns select, installs them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from typing import Any

from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvscope.connector import compat

logger = logging.getLogger("kvscope")

ENV = "KVSCOPE_FAULT_FILE"
OWN_REGION_KEY = "kvscope_test_own_region_ranks"
POLL_S = 0.1

FLIP_PROMOTED = "flip_promoted"
DROP_PROMOTION = "drop_promotion"
STALL_READS = "stall_reads"
STALL_WRITES = "stall_writes"
WITHHOLD_STORE = "withhold_store"
LOSE_ROUNDS = "lose_rounds"
LOSE_FINISHES = "lose_finishes"
LEAK_BLOCKS = "leak_blocks"
SWITCHABLE = (FLIP_PROMOTED, DROP_PROMOTION, STALL_READS, STALL_WRITES, WITHHOLD_STORE,
              LOSE_ROUNDS, LOSE_FINISHES, LEAK_BLOCKS)


def write_fault(path: str, fault: str | None, rank: int = 1) -> None:
    """Switch the fault in ``path`` (atomically: readers never see half a file)."""
    if fault is not None and fault not in SWITCHABLE:
        raise ValueError(f"unknown fault {fault!r}; one of {SWITCHABLE}")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"fault": fault, "rank": rank}, f)
    os.replace(tmp, path)


class FaultSwitch:
    """The fault currently asked for in the file (re-read at most every POLL_S)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._checked = 0.0
        self._mtime = -1
        self._state: tuple[str | None, int] = (None, -1)
        self._lock = threading.Lock()

    def current(self) -> tuple[str | None, int]:
        now = time.monotonic()
        if now - self._checked < POLL_S:
            return self._state
        with self._lock:
            self._checked = now
            try:
                mtime = os.stat(self.path).st_mtime_ns
                if mtime != self._mtime:
                    with open(self.path) as f:
                        raw = json.load(f)
                    self._state = (raw.get("fault"), int(raw.get("rank", 1)))
                    self._mtime = mtime
            except FileNotFoundError:
                self._state = (None, -1)
            except Exception as exc:  # a half-written file from a foreign writer: keep the last
                logger.warning("kvscope faults: cannot read %s: %r", self.path, exc)
        return self._state

    def active(self, fault: str, rank: int | None = None) -> bool:
        name, hit = self.current()
        return name == fault and (rank is None or hit == rank)


def _switch() -> FaultSwitch | None:
    path = os.environ.get(ENV)
    return FaultSwitch(path) if path else None


# ---- scheduler side: the fs tier's thread pool stalls -------------------------------------
def install_tier_stalls(manager: Any) -> None:
    """Before kvscope's taps: hold tier jobs while a stall is on (kvscope sees them pending)."""
    switch = _switch()
    if switch is None:
        return
    logger.warning("kvscope: TEST FAULT HOOKS ACTIVE (%s=%s)", ENV, switch.path)
    for tier in compat.secondary_tiers(manager):
        _stall_tier(tier, switch)


def _stall_tier(tier: Any, switch: FaultSwitch) -> None:
    submit_load, submit_store = tier.submit_load, tier.submit_store
    get_finished_jobs = tier.get_finished_jobs
    held: list[tuple[Any, Any]] = []  # (submit function, job) in submission order

    def release() -> None:
        keep = []
        for submit, job in held:
            fault = STALL_READS if submit is submit_load else STALL_WRITES
            if switch.active(fault):
                keep.append((submit, job))
            else:
                submit(job)
        held[:] = keep

    def stalled_submit_load(job, *a, **kw):
        if switch.active(STALL_READS):
            held.append((submit_load, job))
            return None
        return submit_load(job, *a, **kw)

    def stalled_submit_store(job, *a, **kw):
        if switch.active(STALL_WRITES):
            held.append((submit_store, job))
            return None
        return submit_store(job, *a, **kw)

    def released_get_finished_jobs(*a, **kw):
        if held:
            release()
        return get_finished_jobs(*a, **kw)

    tier.submit_load = stalled_submit_load
    tier.submit_store = stalled_submit_store
    tier.get_finished_jobs = released_get_finished_jobs


# ---- scheduler side: kvscope's round judging fails ------------------------------------------
def install_round_faults(observer: Any) -> None:
    """Before kvscope's hooks (they read ``_judge_plain``, ``_judge_counted``,
    ``_on_finished`` and ``_live`` once): while ``lose_rounds`` is on, every way a round is
    judged (on the aggregator thread, from its summary or its counts, or at once) raises;
    while ``lose_finishes`` is on, a request's end raises on both threads."""
    switch = _switch()
    if switch is None or observer is None:
        return
    judge_plain, record = observer._judge_plain, observer.verdicts.record
    judge_counted = observer._judge_counted

    def lost(*_a: Any, **_kw: Any) -> None:
        raise RuntimeError("kvscope test fault lose_rounds: this round's judging failed")

    def failing_judge_plain(*a: Any, **kw: Any) -> None:
        return (lost if switch.active(LOSE_ROUNDS) else judge_plain)(*a, **kw)

    def failing_judge_counted(*a: Any, **kw: Any) -> None:
        return (lost if switch.active(LOSE_ROUNDS) else judge_counted)(*a, **kw)

    def failing_record(*a: Any, **kw: Any) -> None:
        return (lost if switch.active(LOSE_ROUNDS) else record)(*a, **kw)

    observer._judge_plain = failing_judge_plain
    observer._judge_counted = failing_judge_counted
    observer.verdicts.record = failing_record
    # lose_finishes (the hooks read _live and _on_finished once, too)
    on_finished = observer._on_finished

    def failing_on_finished(rid: str) -> None:
        if switch.active(LOSE_FINISHES):
            raise RuntimeError("kvscope test fault lose_finishes: a request's end was lost")
        on_finished(rid)

    observer._on_finished = failing_on_finished
    if observer._live is not None:
        observer._live = _LosingSet(switch)


class _LosingSet(set):
    """kvscope's live requests, whose ``discard`` (a request's end) raises while
    ``lose_finishes`` is on."""

    def __init__(self, switch: FaultSwitch) -> None:
        super().__init__()
        self.switch = switch

    def discard(self, rid: str) -> None:
        if self.switch.active(LOSE_FINISHES):
            raise RuntimeError("kvscope test fault lose_finishes: a request's end was lost")
        super().discard(rid)


# ---- scheduler side: GPU blocks leak -----------------------------------------------------------
def install_block_leak(connector: Any, pool: Any) -> None:
    """After kvscope's hooks, once vLLM bound its GPU block pool: while ``leak_blocks`` is
    on, a finishing request's blocks each get one more reference in the pool (vLLM's own
    ``touch``, as a prefix hit takes one) before vLLM frees the request's own: they never
    return to the free queue."""
    switch = _switch()
    if switch is None:
        return
    blocks = pool.blocks  # vLLM's KVCacheBlock of each block id

    def leaking(finish: Any, several_groups: bool) -> Any:
        def request_finished(request, block_ids):
            if switch.active(LEAK_BLOCKS):
                ids = [b for group in block_ids for b in group] if several_groups \
                    else list(block_ids)
                pool.touch([blocks[b] for b in ids if not blocks[b].is_null])
            return finish(request, block_ids)
        return request_finished

    connector.request_finished = leaking(connector.request_finished, False)
    connector.request_finished_all_groups = leaking(connector.request_finished_all_groups, True)


# ---- scheduler side: a rank's slot of promoted rows goes wrong ------------------------------
def install_promotion_faults(observer: Any) -> None:
    """After kvscope's taps: corrupt a rank's slot once kvscope has digested the promotion."""
    switch = _switch()
    if switch is None or observer is None:
        return
    view, g = observer.rows.view, observer.geometry  # kvscope's own (scheduler/observer.py)
    if view is None or g is None:
        return
    for tier in compat.secondary_tiers(observer.cs.manager):
        _corrupt_promotions(tier, view, g, switch)


def _corrupt_promotions(tier: Any, view: memoryview, g: Any, switch: FaultSwitch) -> None:
    submit_load, get_finished_jobs = tier.submit_load, tier.get_finished_jobs
    jobs: dict[int, tuple[int, list[int], list[bytes]]] = {}  # job -> (rank, rows, before)

    def slot(row: int, rank: int) -> slice:
        off = g.slot_offset(row, rank)
        return slice(off, off + g.slot_size)

    def watched_submit_load(job, *a, **kw):
        name, rank = switch.current()
        if name in (FLIP_PROMOTED, DROP_PROMOTION) and 0 <= rank < g.world_size:
            rows = compat.job_rows(job)
            before = ([bytes(view[slot(r, rank)]) for r in rows] if name == DROP_PROMOTION
                      else [])
            jobs[job.job_id] = (rank, rows, before)
        return submit_load(job, *a, **kw)

    def corrupting_get_finished_jobs(*a, **kw):
        results = list(get_finished_jobs(*a, **kw))  # kvscope digested the true bytes here
        for res in results:
            entry = jobs.pop(res.job_id, None)
            if entry is None or not res.success:
                continue
            rank, rows, before = entry
            for i, row in enumerate(rows):
                s = slot(row, rank)
                if before:  # the promotion never reached this rank
                    view[s] = before[i]
                else:  # flip the first bytes of every page of the slot
                    for off in range(s.start, s.stop, 4096):
                        view[off] ^= 0xFF
        return results

    tier.submit_load = watched_submit_load
    tier.get_finished_jobs = corrupting_get_finished_jobs


# ---- worker side: a rank does not report its finished stores ---------------------------------
class _WithholdingWorker:
    """Wraps one rank's OffloadingWorker: store completions are held while the fault is on."""

    def __init__(self, inner: Any, rank: int, switch: FaultSwitch) -> None:
        self._inner = inner
        self._rank = rank
        self._switch = switch
        self._stores: set[int] = set()
        self._held: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def submit_store(self, job_id, *a, **kw):
        self._stores.add(job_id)
        return self._inner.submit_store(job_id, *a, **kw)

    def get_finished(self):
        results = list(self._inner.get_finished())
        if self._switch.active(WITHHOLD_STORE, self._rank):
            keep = [r for r in results if r.job_id not in self._stores]
            self._held.extend(r for r in results if r.job_id in self._stores)
            results = keep
        elif self._held:
            results, self._held = self._held + results, []
        for r in results:
            self._stores.discard(r.job_id)
        return results


def install_worker(proxy: Any) -> None:
    """After kvscope's WorkerProxy exists: put the withholding wrapper beneath it."""
    switch = _switch()
    if switch is None or proxy is None:
        return
    proxy._inner = _WithholdingWorker(proxy._inner, proxy.rank, switch)


# ---- structural: a rank maps its own offload region -------------------------------------------
class OwnRegionTieringSpec(TieringOffloadingSpec):
    """TieringOffloadingSpec whose listed worker ranks map a region of their own.

    Test-only. The scheduler's region and the other ranks' stay shared; a listed
    rank (> 0) gets a fresh ``/dev/shm`` file, as on a second node, so promotions
    (written by the scheduler into the shared region) never reach it.
    """

    def __init__(self, config):
        ranks = {int(r) for r in (config.extra_config or {}).get(OWN_REGION_KEY, ())}
        rank = compat.process_rank()
        if rank in ranks and rank > 0:
            config = dataclasses.replace(config, engine_id=f"{config.engine_id}-node{rank}")
            logger.warning("kvscope: TEST FAULT: rank %d maps its own offload region", rank)
        super().__init__(config)
