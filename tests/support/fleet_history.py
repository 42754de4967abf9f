"""A fleet engine's kvscope history as OpenMetrics text, for ``promtool tsdb create-blocks-from``.

The shape (the fleet-scale kv-diagnose benchmark's, diagnose_fleet_scale.py): one vLLM engine of
``world_size`` worker ranks scraped through vLLM's own /metrics (``engine``/``model_name``
labels, ``instance``/``job`` as Prometheus adds them), every series a real kvscope exports
(the closed label values of ``exporters/signals.py``, worker series per rank, the manager's
disk transfers under rank="manager"), one sample per ``interval`` seconds.

Values evolve like a serving engine's: counters grow with a diurnal load curve, gauges
follow it, timestamps move with the clock. Two incidents are built in:

* ``stuck``: one load transfer stays pending for ``STUCK_S`` seconds on an idle engine,
  a few days before the end, then completes (kvscope_pending_transfers{kind="load"}=1,
  its age gauge climbing to STUCK_S); kv-diagnose must report it (unclassified anomaly,
  stuck transfer) although it is a few minutes out of seven days;
* ``ceiling``: for the last ``CEILING_S`` seconds, lookup rounds are vetoed at the
  primary tier's row ceiling (the pending-key sum pinned at every row): the capacity
  ceiling, veto form.

Each series is written whole for one chunk of time (a UTC day), so a chunk is one
promtool input and one TSDB block.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from kvscope.exporters import signals as S

ROWS = 65536  # primary-tier rows
ROW_BYTES = 2 << 20
GROUPS = 4  # KV groups
STUCK_S = 480  # the stuck load transfer's age when it completes
CEILING_S = 6 * 3600
EXPECTED = ("capacity_ceiling_veto", "unclassified_anomaly")  # the findings the data shows
Fn = Callable[[np.ndarray], np.ndarray]  # sample times -> values


@dataclass(frozen=True)
class Shape:
    end: float  # last sample time (unix seconds)
    span: float  # seconds of history before it
    interval: int = 60
    world_size: int = 512
    instance: str = "fleet-engine-0:8000"
    # when the stuck transfer starts; 0: 3.4 days before the end (at most half the span)
    stuck_at: float = 0.0

    @property
    def start(self) -> float:
        return self.end - self.span

    @property
    def stuck_from(self) -> float:
        return self.stuck_at or self.end - min(3.4 * 86400, self.span / 2)

    @property
    def ceiling_from(self) -> float:
        return self.end - CEILING_S


def _load(t: np.ndarray) -> np.ndarray:
    """Requests per second: a diurnal curve, never quite idle."""
    return 40.0 + 35.0 * np.sin(2 * math.pi * (t % 86400) / 86400)


def _work(t: np.ndarray) -> np.ndarray:
    """Integral of :func:`_load` since the epoch: what a counter driven by load has done."""
    w = 2 * math.pi / 86400
    return 40.0 * t - 35.0 / w * np.cos(w * (t % 86400))


def _since(t: np.ndarray, t0: float) -> np.ndarray:
    return np.clip(t - t0, 0, None)


class History:
    """Every series of :class:`Shape` as (name, labels, fn)."""

    def __init__(self, shape: Shape):
        self.shape = shape
        self.base = {"instance": shape.instance, "job": "vllm", S.VLLM_LABEL_ENGINE: "0",
                     S.VLLM_LABEL_MODEL: "fleet-model"}
        self.t0 = shape.start - 3600.0  # the process started an hour before the window

    # -- helpers ------------------------------------------------------------------------
    def grow(self, per_request: float) -> Fn:
        """A counter growing ``per_request`` per request since the process started."""
        t0 = self.t0
        return lambda t: np.floor(per_request * (_work(t) - _work(np.array([t0]))[0]))

    def ceiling_mask(self, t: np.ndarray) -> np.ndarray:
        return t >= self.shape.ceiling_from

    def stuck_age(self, t: np.ndarray) -> np.ndarray:
        a = t - self.shape.stuck_from
        return np.where((a >= 0) & (a <= STUCK_S), a, 0.0)

    def series(self) -> Iterator[tuple[str, dict[str, str], Fn]]:
        yield from self._scheduler()
        yield from self._vllm()
        for rank in range(self.shape.world_size):
            yield from self._worker(str(rank))
        yield from self._manager()

    # -- the scheduler's series -----------------------------------------------------------
    def _scheduler(self):
        sh, grow, ceil = self.shape, self.grow, self.ceiling_mask
        info = {"kvscope_version": "0.1.0", "vllm_version": "0.26.0", "spec": "TieringSpec",
                "tiers": "cpu+fs", "primary_rows": str(ROWS), "hash_seed": "5eed",
                "checksum_policy": "refuse", "chunk_tokens": "16",
                "max_num_batched_tokens": "8192", "world_size": str(sh.world_size)}
        yield S.INFO.name, info, lambda t: np.ones_like(t)
        for g in range(GROUPS):
            yield (S.KV_GROUP_INFO.name, {"kv_group": str(g), "kind": "full_attention",
                                          "tokens_per_block": "16"}, lambda t: np.ones_like(t))
        before_ceiling = self._frozen_at(sh.ceiling_from)
        rounds = {
            # hits stop at the ceiling; vetoes start there
            "hit": before_ceiling(grow(0.45)),
            "deferred": grow(0.05),
            "miss": grow(0.5),
            "vetoed": lambda t: np.where(ceil(t), np.floor(0.45 * (_work(t) - _work(
                np.array([sh.ceiling_from]))[0])), 0.0),
        }
        for v, fn in rounds.items():
            yield S.LOOKUP_ROUNDS.name, {"verdict": v}, fn
        yield S.ROUNDS_AT_ROW_CEILING.name, {"verdict": "vetoed"}, rounds["vetoed"]
        yield S.ROUNDS_AT_ROW_CEILING.name, {"verdict": "deferred"}, _zero
        pinned = lambda t: np.where(ceil(t), float(ROWS), 40.0)  # noqa: E731
        yield S.LAST_ROUND_PENDING_KEYS.name, {"verdict": "vetoed"}, pinned
        yield S.LAST_ROUND_PENDING_KEYS.name, {"verdict": "deferred"}, lambda t: 0 * t + 24.0
        yield (S.LAST_ROUND_REQUEST_KEYS.name, {"verdict": "vetoed"},
               lambda t: np.where(ceil(t), ROWS + ROWS // 10, 48.0))
        yield S.LAST_ROUND_REQUEST_KEYS.name, {"verdict": "deferred"}, lambda t: 0 * t + 32.0
        for g in range(GROUPS):
            for r, k in (("hit", 9.0), ("hit_pending", 0.5), ("miss", 10.0), ("retry", 1.0)):
                yield S.LOOKUPS.name, {"kv_group": str(g), "result": r}, grow(k)
        yield S.HIT_TOKENS.name, {}, before_ceiling(grow(300.0))
        yield S.RESTORE_HELD_TOKENS.name, {}, before_ceiling(grow(305.0))
        for r in S.ShortReason:
            yield (S.RESTORE_SHORT_ROUNDS.name, {"reason": r.value},
                   grow(0.02) if r is S.ShortReason.LOAD_CAP else _zero)
            yield (S.RESTORE_SHORT_TOKENS.name, {"reason": r.value},
                   grow(0.3) if r is S.ShortReason.LOAD_CAP else _zero)
        for f in S.CeilingForm:
            yield S.RESTORE_CEILING_ROUNDS.name, {"form": f.value}, _zero
        for name in (S.LAST_CEILING_OFFERED_TOKENS, S.LAST_CEILING_HELD_TOKENS,
                     S.LAST_CEILING_ROWS_NEEDED, S.LAST_CEILING_CONCURRENT_REQUESTS,
                     S.LAST_CEILING_CONCURRENT_ROWS):
            yield name.name, {}, _zero
        for name, per in ((S.ROUND_PENDING_KEYS, 30.0), (S.RESTORE_COVERAGE, 0.97)):
            yield name.name + "_sum", {}, grow(per)
            yield name.name + "_count", {}, grow(1.0)
        rows = {"total": lambda t: 0 * t + ROWS,
                "occupied": lambda t: np.minimum(ROWS, np.floor(ROWS * 0.6 + 300 * _load(t))),
                "in_flight": lambda t: np.floor(_load(t) / 8)}
        for st, fn in rows.items():
            yield S.PRIMARY_ROWS.name, {"state": st}, fn
        yield S.PRIMARY_ROW_BYTES.name, {}, lambda t: 0 * t + ROW_BYTES
        promos = {"started": grow(0.2), "completed": grow(0.2), "failed": _zero,
                  "no_row": lambda t: np.where(ceil(t), np.floor(0.05 * _since(t, sh.ceiling_from)),
                                               0.0)}
        for r, fn in promos.items():
            yield S.PROMOTIONS.name, {"result": r}, fn
        for r, fn in {"started": grow(0.3), "completed": grow(0.3), "failed": _zero}.items():
            yield S.CASCADES.name, {"result": r}, fn
        yield S.STORE_JOBS.name, {"result": "prepared"}, grow(1.0)
        yield S.STORE_JOBS.name, {"result": "no_space"}, _zero
        stuck = self.stuck_age
        for k in S.PendingKind:
            if k is S.PendingKind.LOAD:
                yield (S.PENDING_TRANSFERS.name, {"kind": k.value},
                       lambda t: np.where(stuck(t) > 0, 1.0, 0.0))
                yield S.OLDEST_PENDING_TRANSFER.name, {"kind": k.value}, stuck
            else:
                yield S.PENDING_TRANSFERS.name, {"kind": k.value}, _zero
                yield S.OLDEST_PENDING_TRANSFER.name, {"kind": k.value}, _zero
        busy = self._busy
        for st, share in (("queued", 0.1), ("deferred", 0.02), ("loading", 0.05),
                          ("running", 1.0)):
            yield S.REQUESTS.name, {"state": st}, lambda t, s=share: np.floor(s * busy(t))
        yield S.REQUESTS_IN_FLIGHT.name, {}, lambda t: np.floor(1.17 * busy(t))
        yield S.SCHEDULER_STEPS.name, {}, lambda t: np.floor(20.0 * (t - self.t0))
        yield S.LAST_STEP_TIMESTAMP.name, {}, lambda t: np.floor(t)
        for w in S.TELEMETRY_ERRORS.label_values["where"]:
            yield S.TELEMETRY_ERRORS.name, {"where": w}, _zero
        yield S.QUARANTINED_KEYS.name, {}, _zero
        yield S.TIER_LOST_KEYS.name, {"tier": "fs"}, _zero
        yield S.TIER_ROOT_PRESENT.name, {"tier": "fs"}, lambda t: np.ones_like(t)
        yield S.TIER_LAST_LOSS_TIMESTAMP.name, {"tier": "fs"}, _zero

    def _busy(self, t: np.ndarray) -> np.ndarray:
        """Requests running: follows the load, 0 while the stuck transfer waits (idle)."""
        return np.where(self.stuck_age(t) > 0, 0.0, np.floor(_load(t) * 2))

    def _frozen_at(self, at: float):
        """A counter that stops growing at ``at``."""
        def wrap(fn: Fn) -> Fn:
            frozen = float(fn(np.array([at]))[0])
            return lambda t: np.where(t >= at, frozen, fn(t))
        return wrap

    def _vllm(self):
        grow, busy = self.grow, self._busy
        yield S.VLLM_REQUESTS_RUNNING, {}, busy
        yield S.VLLM_REQUESTS_WAITING, {}, lambda t: np.floor(0.1 * busy(t))
        for r in ("capacity", "deferred"):
            yield S.VLLM_REQUESTS_WAITING_BY_REASON, {"reason": r}, lambda t: 0 * t
        yield S.VLLM_EXTERNAL_PREFIX_QUERIES, {}, grow(1000.0)
        yield S.VLLM_EXTERNAL_PREFIX_HITS, {}, grow(300.0)
        yield S.VLLM_OFFLOAD_LOAD_BYTES, {}, grow(9.0 * ROW_BYTES)
        yield S.VLLM_OFFLOAD_STORE_BYTES, {}, grow(12.0 * ROW_BYTES)
        yield S.VLLM_REQUEST_QUEUE_TIME + "_sum", {}, grow(0.05)
        yield S.VLLM_REQUEST_QUEUE_TIME + "_count", {}, grow(1.0)

    # -- one worker rank's series, and the manager's ----------------------------------------
    def _worker(self, rank: str):
        grow = self.grow
        share = ROW_BYTES / self.shape.world_size
        for d, per in ((S.Direction.GPU_TO_CPU, 12.0), (S.Direction.CPU_TO_GPU, 9.0)):
            lab = {"rank": rank, "direction": d.value}
            yield S.TRANSFER_BYTES.name, lab, grow(per * share)
            yield S.TRANSFER_SECONDS.name + "_sum", lab, grow(per * 0.002)
            yield S.TRANSFER_SECONDS.name + "_count", lab, grow(per)
            yield S.TRANSFERS_IN_FLIGHT.name, lab, lambda t: np.floor(_load(t) / 40)
        yield S.ROW_CHECKSUMS.name, {"rank": rank, "outcome": "match"}, grow(9.0)
        yield S.ROW_CHECKSUMS.name, {"rank": rank, "outcome": "mismatch"}, _zero
        for r in S.LOADS_REFUSED.label_values["reason"]:
            yield S.LOADS_REFUSED.name, {"rank": rank, "reason": r}, _zero
        yield S.WORKER_LAST_STEP_TIMESTAMP.name, {"rank": rank}, lambda t: np.floor(t)

    def _manager(self):
        grow = self.grow
        for d, per in ((S.Direction.DISK_TO_CPU, 0.2), (S.Direction.CPU_TO_DISK, 0.3)):
            lab = {"rank": S.RANK_MANAGER, "direction": d.value}
            yield S.TRANSFER_BYTES.name, lab, grow(per * ROW_BYTES)
            yield S.TRANSFER_SECONDS.name + "_sum", lab, grow(per * 0.01)
            yield S.TRANSFER_SECONDS.name + "_count", lab, grow(per)


def _zero(t: np.ndarray) -> np.ndarray:
    return np.zeros_like(t)


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def chunks(shape: Shape, seconds: int = 86400) -> Iterator[tuple[float, float]]:
    """[from, to) pieces of the history, cut at multiples of ``seconds`` (UTC days)."""
    lo = shape.start
    while lo <= shape.end:
        hi = min((math.floor(lo / seconds) + 1) * seconds, shape.end + 1)
        yield lo, hi
        lo = hi


def write_chunk(history: History, lo: float, hi: float, path, eof: bool = True,
                append: bool = False) -> int:
    """Samples of every series in [lo, hi) to ``path`` (OpenMetrics); returns the count.
    ``eof=False``: leave the file open for more series (end it with ``# EOF``);
    ``append``: after what ``path`` holds (another engine's series of the same chunk)."""
    sh = history.shape
    first = sh.start + math.ceil((lo - sh.start) / sh.interval) * sh.interval
    t = np.arange(first, hi, sh.interval, dtype=np.float64)
    stamps = [f"{int(x)}\n" for x in t]
    n = 0
    with open(path, "a" if append else "w") as f:
        for name, labels, fn in history.series():
            head = f"{name}{{{_labels({**history.base, **labels})}}} "
            vals = fn(t)
            vs = [repr(v) if v != int(v) else str(int(v)) for v in vals.tolist()]
            f.write("".join([f"{head}{v} {s}" for v, s in zip(vs, stamps, strict=True)]))
            n += len(vs)
        if eof:
            f.write("# EOF\n")
    return n
