"""Snapshot gauges of the scheduler side: rows, pending transfers, requests, vLLM's GPU
block pool, the host's memory, info.

Gauges are what a scrape (seconds apart) reads, so they are refreshed on the
aggregator thread (aggregator.py) every ``flush_interval_s`` (default 1 s) while the
engine is busy (off vLLM's scheduler thread), and synchronously on every step of an idle
engine and at shutdown; a reader's drain (a scrape) leaves them at that cadence.
What they read of vLLM's state is copied in one C-level call. The host's memory is read
at most every ``host_memory.SAMPLE_S`` (5 s) of these refreshes.
"""

from __future__ import annotations

import time
from typing import Any

from kvscope import __version__
from kvscope.connector import compat
from kvscope.connector.compat import hash_lookahead, vllm_api
from kvscope.connector.export.host_memory import HostMemory
from kvscope.connector.integrity.promoted_rows import PromotedRows
from kvscope.connector.lookup.request_states import STATES, RequestStates
from kvscope.connector.tiers.taps import TierTaps
from kvscope.exporters import signals
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import (
    DrafterKeys,
    GpuBlockState,
    PendingKind,
    RankCheck,
    RowState,
)

# The recorder's keys (metric, labels) of every snapshot gauge, built once
_ROW_KEYS = tuple((signals.PRIMARY_ROWS, (s.value,))
                  for s in (RowState.TOTAL, RowState.OCCUPIED, RowState.IN_FLIGHT))
_STATE_KEYS = tuple((signals.REQUESTS, (s.value,)) for s in STATES)
# (pending count, oldest pending) per kind: load, store, promotion, cascade
_PENDING_KEYS = tuple(((signals.PENDING_TRANSFERS, (k.value,)),
                       (signals.OLDEST_PENDING_TRANSFER, (k.value,)))
                      for k in (PendingKind.LOAD, PendingKind.STORE, PendingKind.PROMOTION,
                                PendingKind.CASCADE))
_IN_FLIGHT_KEY = (signals.REQUESTS_IN_FLIGHT, ())
_QUARANTINED_KEY = (signals.QUARANTINED_KEYS, ())
_DIGESTED_KEY = (signals.CHECKSUM_RANKS, (RankCheck.DIGESTED.value,))
_SHARED_KEY = (signals.CHECKSUM_RANKS, (RankCheck.SHARED_REGION.value,))
_GPU_TOTAL_KEY = (signals.GPU_BLOCKS, (GpuBlockState.TOTAL.value,))
_GPU_IN_USE_KEY = (signals.GPU_BLOCKS, (GpuBlockState.IN_USE.value,))


class StepGauges:
    def __init__(self, *, recorder: Recorder, connector_scheduler: Any, taps: TierTaps,
                 requests: RequestStates, rows: PromotedRows, spec: Any, vllm_config: Any,
                 kv_cache_config: Any, checksum_policy: str) -> None:
        self.rec = recorder
        self.cs = connector_scheduler
        self.taps = taps
        self.requests = requests
        self.rows = rows
        self.spec = spec
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.checksum_policy = checksum_policy
        # read once: kv-diagnose compares the ranks it sees with it (a rank missing everywhere)
        ws = compat.world_size(spec, vllm_config)
        self.world_size = str(ws) if ws is not None else ""
        self.refreshed_at = 0.0
        self._job_first_seen: dict[int, float] = {}
        self._static_done = False
        self._fingerprint_src: object = None
        # vLLM's GPU block pool, once the scheduler binds it (bind_block_pool)
        self.gpu_blocks_total = 0
        self.gpu_blocks_in_use: Any = None  # () -> blocks in use now (compat)
        self.host = HostMemory()

    def bind_block_pool(self, total: int, in_use: Any) -> None:
        """vLLM's block pool: its size and a reader of the blocks in use (compat); both
        gauges exported from now on."""
        self.gpu_blocks_total, self.gpu_blocks_in_use = total, in_use
        self.rec.set_many([(_GPU_TOTAL_KEY, total), (_GPU_IN_USE_KEY, in_use())])

    def refresh(self) -> None:
        """Every gauge's value now, into the recorder in one call (one lock); on an
        error, what was read before it still is (as one set() per gauge would)."""
        now = self.refreshed_at = time.monotonic()
        values = list(zip(_ROW_KEYS, compat.row_states(self.taps.primary)))
        try:
            self._read(now, values)
        finally:
            self.rec.set_many(values)
        self._update_info(values[0][1])

    def _read(self, now: float, values: list) -> None:
        """Pending transfers and request gauges, appended to ``values``."""
        loads: list[float] = []
        stores: list[float] = []
        live = set()
        first_seen = self._job_first_seen
        for jid, is_store in compat.connector_jobs(self.cs):
            live.add(jid)
            (stores if is_store else loads).append(first_seen.setdefault(jid, now))
        for jid in [j for j in first_seen if j not in live]:
            del first_seen[jid]
        # list(): one C-level copy; vLLM's thread changes these dicts meanwhile
        promotions = list(self.taps.promotions.values())
        cascades = list(self.taps.cascades.values())
        for (count_key, oldest_key), times in zip(_PENDING_KEYS, (
                loads, stores, [j.started for j in promotions],
                [j.started for j in cascades])):
            values.append((count_key, len(times)))
            values.append((oldest_key, now - min(times) if times else 0.0))
        values.extend(zip(_STATE_KEYS, self.requests.counts))
        values.append((_IN_FLIGHT_KEY, len(self.requests)))
        values.append((_QUARANTINED_KEY, len(self.rows.quarantine)))
        ranks = self.rows.ranks if self.rows.active else None
        values.append((_DIGESTED_KEY, len(ranks.digested) if ranks is not None else 0))
        values.append((_SHARED_KEY, len(ranks.shared) if ranks is not None else 0))
        in_use = self.gpu_blocks_in_use
        if in_use is not None:  # an int vLLM's thread changes meanwhile: read once
            values.append((_GPU_TOTAL_KEY, self.gpu_blocks_total))
            values.append((_GPU_IN_USE_KEY, in_use()))
        values.extend(self.host.sample(now))

    def _update_info(self, rows_total: int) -> None:
        src = vllm_api.none_hash()
        if self._static_done and src is self._fingerprint_src:
            return
        self._fingerprint_src = src
        tiers = "+".join(["cpu", *(compat.tier_type(t) for t in self.taps.tiers)])
        tpb = compat.group_tokens_per_block(self.spec)
        chunk_tokens = (tpb[0] if tpb else 0) * compat.blocks_per_chunk(self.spec)
        batched = getattr(getattr(self.vllm_config, "scheduler_config", None),
                          "max_num_batched_tokens", "")
        self.rec.replace_gauge(signals.INFO, {(
            __version__, compat.VLLM_VERSION, type(self.spec).__name__, tiers,
            str(rows_total), compat.hash_fingerprint(self.vllm_config), self.checksum_policy,
            str(chunk_tokens), str(batched), self.world_size): 1.0})
        geometry = self.rows.geometry
        if geometry is not None:
            self.rec.set(signals.PRIMARY_ROW_BYTES, (), geometry.row_stride)
        if not self._static_done:
            kinds = compat.kv_group_kinds(self.kv_cache_config)
            drafter = hash_lookahead.drafter_keys(self.cs, self.vllm_config)
            per_chunk = compat.blocks_per_chunk(self.spec)
            restore = compat.restore_chunks(self.kv_cache_config, [t * per_chunk for t in tpb])
            self.rec.replace_gauge(signals.KV_GROUP_INFO, {
                (str(g), kind, str(tpb[g] if g < len(tpb) else 0),
                 drafter.get(g, DrafterKeys.NONE.value),
                 str(restore[g] if g < len(restore) else 0)): 1.0
                for g, kind in enumerate(kinds)})
            self._static_done = True
