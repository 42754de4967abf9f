"""The long-prompt round's workload (scale_round.py) and engine truth: a long prompt asked, flooded out of the GPU
blocks and the primary tier, asked again and restored from the fs tier's disk.

Sizes follow the prompt: its keys (16-token chunks), primary rows enough for its restore
(at least ``min_rows``), GPU blocks for it alone, and a flood of other prompts (none longer
than it) that outnumbers both, so the re-ask finds every key on disk and none in a faster
place. What the engine did is read from the engine and the tiers (vLLM's finished
requests, the primary tier's cache policy, the fs tier's files), never from kvscope.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BLOCK = 16  # tokens per GPU block and per key (vLLM's offloading block size here)
MARGIN = 256  # blocks: rows and GPU blocks beyond the prompt, flood beyond both
OUT = 2  # tokens generated per request: each decode step digests the whole KV (cpu_model)


@dataclass(frozen=True)
class Sizes:
    tokens: int  # the long prompt
    keys: int  # its keys, one per full chunk
    rows: int  # primary-tier rows
    gpu_blocks: int
    flood: tuple[int, ...]  # the flood's prompts, in tokens, asked one after another

    @property
    def flood_keys(self) -> int:
        return sum(self.flood) // BLOCK


def sizes(tokens: int, min_rows: int) -> Sizes:
    keys = tokens // BLOCK
    rows = max(min_rows, keys + MARGIN)
    gpu = keys + OUT + MARGIN
    # LRU on both: the prompt's keys are the oldest, so a flood of more keys than the tier
    # (and the GPU) holds evicts every one of them
    flood_keys = max(rows, gpu) + MARGIN
    n = -(-flood_keys * BLOCK // tokens)
    return Sizes(tokens, keys, rows, gpu, (-(-flood_keys // n) * BLOCK,) * n)


def engine(connector: str, s: Sizes, batch: int, delay_steps: int = 0,
           options: dict | None = None):
    """``delay_steps``: each promotion (disk -> primary) stays in flight that many steps
    after the one that started it (kvscope.sim.promotion_delay: a disk slower than a
    forward), so the re-ask's lookup is deferred, and repeated, that many times."""
    from kvscope.sim.cpu_engine import CPUEngine, EngineConfig

    return CPUEngine(EngineConfig(
        rows=s.rows, tiering=True, world_size=1, kv_groups=1, num_gpu_blocks=s.gpu_blocks,
        max_num_batched_tokens=batch, max_num_seqs=4, max_model_len=s.tokens + 4 * BLOCK,
        connector=connector, step_time_s=0.0, promotion_delay_steps=delay_steps,
        kvscope_options=dict(options or {})))


def fs_type(path: str) -> str:
    """The filesystem type ``path`` lives on (/proc/mounts' longest mount point above it)."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            _, mnt, typ = line.split()[:3]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best, kind = mnt, typ
    return kind


def held_keys(e, rid: str) -> tuple[int, int]:
    """Engine truth before a re-ask: (keys of ``rid``'s prompt in the primary tier's rows,
    keys of its prefix in the fs tier's files on disk)."""
    from vllm.v1.kv_offload.base import make_offload_key

    manager = e.connector.connector_scheduler.manager
    primary = manager.primary_tier
    tier = manager.secondary_tiers[0]
    keys = [make_offload_key(h, 0) for h in e.scheduler.requests[rid].block_hashes]
    in_primary = sum(primary._policy.get(k) is not None for k in keys)
    on_disk = 0
    for k in keys:
        if not os.path.exists(tier.file_mapper.get_file_name(k)):
            break
        on_disk += 1
    return in_primary, on_disk


def expected_restore(disk_keys: int) -> int:
    """Tokens a re-ask should load from disk: every chunk of its prefix the disk held."""
    return disk_keys * BLOCK


class KeyCount:
    """Keys the connector scheduler's prefix scan looked up (``_maximal_prefix_lookup``:
    every key a lookup round reads, up to the first MISS). Counted once per scan, not per
    key: the scan is handed an iterator over its keys and what is left of it afterwards is
    read (``__length_hint__``), so the hot path is unchanged. Where kvscope taps the scan
    (its tap slices the keys: an iterator will not do) nothing is counted: ``keys`` None."""

    METHOD = "_maximal_prefix_lookup"

    def __init__(self, e) -> None:
        from kvscope.connector import compat

        cs = e.connector.connector_scheduler
        inner = getattr(cs, self.METHOD)
        self.keys: int | None = None
        self.scans = 0
        if getattr(inner, compat.WRAPPED_MARK, False):
            return
        self.keys = 0

        def counted(keys, *rest):
            it = iter(keys)
            try:
                return inner(it, *rest)
            finally:
                self.scans += 1
                self.keys += len(keys) - it.__length_hint__()

        setattr(cs, self.METHOD, counted)


def telemetry_errors(e) -> dict[str, float]:
    """kvscope_telemetry_errors_total per ``where`` (non-zero ones), the scheduler side's
    recorder and every rank's summed; {} with the stock connector."""
    from kvscope.exporters import signals as S

    out: dict[str, float] = {}
    for conn in [e.connector, *(r.connector for r in e.ranks)]:
        rec = getattr(conn, "kvscope_recorder", None)
        if rec is None:
            continue
        for site in S.ErrorSite:
            v = rec.value(S.TELEMETRY_ERRORS, (site.value,))
            if v:
                out[site.value] = out.get(site.value, 0.0) + v
    return out
