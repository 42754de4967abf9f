"""The CPU engine's knobs (:class:`EngineConfig`) and the vLLM configs they become.

Kept apart from the engine that runs them: what a scenario asks for (rows, tiers, ranks,
KV groups, policies) turns into vLLM's own ``VllmConfig`` and ``KVCacheConfig`` here,
the offloading connector's extra config included, and nothing here runs a step.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)

from kvscope.sim import cpu_worker, harness_compat
from kvscope.sim.cpu_model import VOCAB


@dataclass
class EngineConfig:
    rows: int = 64  # primary-tier rows
    tiering: bool = True  # TieringOffloadingSpec + fs tier, else CPUOffloadingSpec
    world_size: int = 1
    kv_groups: int = 1
    # Tokens of attention window of the last KV group (a sliding-window group,
    # as in hybrid models); None: every group is full attention.
    sliding_window: int | None = None
    num_layers: int = 2
    block_size: int = 16
    # Each KV group's block size in tokens (empty: block_size for every group). Groups of
    # different block sizes (a hybrid model's large-block groups beside a sub-block or
    # drafter group) have one page size (vLLM unifies it), so different head shapes; one chunk
    # is one block of its group (blocks_per_chunk 1), and vLLM's scheduler works in their
    # least common multiple, its block hashes in their greatest common divisor.
    group_block_sizes: tuple[int, ...] = ()
    # Speculative decoding with an EAGLE drafter (one draft token): the last KV group is the
    # drafter's (flagged as vLLM flags a draft model's layers), so it gets vLLM's EAGLE
    # handling; vLLM 0.34 then keys blocks with lookahead tokens (harness_compat).
    drafter: bool = False
    num_gpu_blocks: int = 128
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 8
    max_model_len: int = 4096
    own_region_ranks: tuple[int, ...] = ()  # ranks with their own /dev/shm region
    stuck: Callable[[int, str, int], bool] | None = None  # (rank, kind, job id) -> never report
    # (rank, kind, job id) -> report the copy failed, as a GPU copy that raised (vLLM >= 0.34
    # takes failed transfers; earlier releases assert every transfer succeeded)
    failed: Callable[[int, str, int], bool] | None = None
    # A test fault of kvscope.sim.faults on for this engine's scheduler side (its
    # KVSCOPE_FAULT_FILE names a file in the engine's temp dir while the scheduler is built)
    fault: str | None = None
    # kvscope's connector with the test fault hooks (kvscope.sim.fault_connector), armed by
    # KVSCOPE_FAULT_FILE where the caller sets it; a fault above implies it
    fault_hooks: bool = False
    checksum_policy: str = "refuse"
    kv_load_failure_policy: str = "recompute"
    exporter_port: int | None = None
    kvscope_options: dict[str, Any] = field(default_factory=dict)  # more kvscope settings
    # More of vLLM's offloading options (kv_connector_extra_config), e.g. offload_prompt_only
    offload_options: dict[str, Any] = field(default_factory=dict)
    connector: str = "ObservedOffloadingConnector"  # or "OffloadingConnector" (stock)
    # Name the connector only (no kv_connector_module_path): vLLM's factory must know it
    # already (ObservedOffloadingConnector: kvscope's vllm.general_plugins entry point).
    connector_by_name: bool = False
    hash_seed: str | None = "0"  # PYTHONHASHSEED for NONE_HASH; None = random
    fs_root: str | None = None
    model_dir: str | None = None  # share it (and fs_root) to model a restarted engine
    # Wall time one step takes (a GPU forward would); the fs tier's I/O threads
    # run meanwhile, as they do beside a real engine.
    step_time_s: float = 0.0
    # Finish each step's tier I/O before the next step (repeatable scenarios);
    # off, the fs tier's threads race the steps as beside a real engine.
    settle_tiers: bool = True
    # With settle_tiers: the fs tier's promotions stay in flight for this many steps after
    # the one that started them (0: done by the next step); kvscope.sim.promotion_delay.
    promotion_delay_steps: int = 0
    # Feed scheduler stats to vLLM's own PrometheusStatLogger (the global
    # prometheus-client registry), as `vllm serve` does for its /metrics.
    vllm_metrics: bool = False

    def __post_init__(self) -> None:
        if self.group_block_sizes and len(self.group_block_sizes) != self.kv_groups:
            raise ValueError(f"group_block_sizes {self.group_block_sizes} names "
                             f"{len(self.group_block_sizes)} KV groups, not {self.kv_groups}")

    @property
    def block_sizes(self) -> list[int]:
        """Each KV group's block size in tokens."""
        return list(self.group_block_sizes) or [self.block_size] * self.kv_groups


@dataclass
class VllmConfigs:
    """What vLLM is built with for one engine, and the KV geometry the ranks share."""

    vllm_config: VllmConfig
    kv_cache_config: KVCacheConfig
    layers: list[str]  # attention layer names, every KV group's
    page: int  # bytes of one block of one layer
    row_bytes: int  # bytes of one primary-tier row (every rank's slot)


def build_vllm_configs(cfg: EngineConfig, engine_id: str, fs_root: str,
                       model_dir: str) -> VllmConfigs:
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(cfg.num_layers * cfg.kv_groups)]
    # one page per block of every group: that of the smallest block with 2 heads of 16
    spec = FullAttentionSpec(block_size=min(cfg.block_sizes), num_kv_heads=2, head_size=16,
                             dtype=torch.float16)
    page = spec.page_size_bytes
    kv_cache_config = KVCacheConfig(
        num_blocks=cfg.num_gpu_blocks,
        kv_cache_tensors=harness_compat.kv_cache_tensors(layers, cfg.num_gpu_blocks, page),
        kv_cache_groups=_kv_cache_groups(cfg, layers))
    worker_bytes_per_block = page * len(layers)
    row_bytes = _round_up(worker_bytes_per_block * cfg.world_size, 4096)
    ktc = _kv_transfer_config(cfg, engine_id, fs_root, row_bytes)
    model_config = ModelConfig(model=model_dir, tokenizer=None, skip_tokenizer_init=True,
                               dtype="float16", max_model_len=cfg.max_model_len, seed=0)
    # Ranks are simulated in this process; the offload geometry (rank slots
    # per row) follows the configured world size.
    parallel = ParallelConfig(tensor_parallel_size=cfg.world_size)
    speculative = _eagle_drafter(model_dir, model_config, parallel) if cfg.drafter else None
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=min(cfg.block_sizes), enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=cfg.max_model_len, is_encoder_decoder=False,
            async_scheduling=False),
        parallel_config=parallel,
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=ktc,
        speculative_config=speculative)
    vllm_config.cache_config.num_gpu_blocks = cfg.num_gpu_blocks
    return VllmConfigs(vllm_config, kv_cache_config, layers, page, row_bytes)


def _kv_cache_groups(cfg: EngineConfig, layers: list[str]) -> list[KVCacheGroupSpec]:
    # Groups of one attention kind with distinct head shapes (same page size):
    # vLLM keeps them as separate KV-cache groups, each with its own keys.
    group_specs = [FullAttentionSpec(block_size=bs, num_kv_heads=h, head_size=d,
                                     dtype=torch.float16)
                   for bs, (h, d) in zip(cfg.block_sizes, _head_shapes(cfg.block_sizes))]
    if cfg.sliding_window is not None:
        last = group_specs[-1]
        group_specs[-1] = SlidingWindowSpec(
            block_size=last.block_size, num_kv_heads=last.num_kv_heads,
            head_size=last.head_size, dtype=torch.float16, sliding_window=cfg.sliding_window)
    return [KVCacheGroupSpec(layers[g::cfg.kv_groups], group_specs[g],
                             is_eagle_group=cfg.drafter and g == cfg.kv_groups - 1)
            for g in range(cfg.kv_groups)]


def _eagle_drafter(model_dir: str, model_config: ModelConfig,
                   parallel: ParallelConfig) -> SpeculativeConfig:
    """An EAGLE drafter of one layer beside the target, config only (the harness runs no
    forward pass, so none is ever proposed): what the scheduler and the offloading
    connector build from when a deployment speculates with EAGLE."""
    from transformers import LlamaConfig

    draft_dir = os.path.join(model_dir, "drafter")
    if not os.path.exists(os.path.join(draft_dir, "config.json")):
        LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=model_config.max_model_len,
                    architectures=["LlamaForCausalLM"]).save_pretrained(draft_dir)
    return SpeculativeConfig(method="eagle", model=draft_dir, num_speculative_tokens=1,
                             target_model_config=model_config, target_parallel_config=parallel)


def _head_shapes(block_sizes: list[int]) -> list[tuple[int, int]]:
    """(kv heads, head size) per group: one page size for all (heads x head size x block
    size constant: 32 x the smallest block), distinct among groups of one block size."""
    shapes: list[tuple[int, int]] = []
    for bs in block_sizes:
        product = 32 * min(block_sizes) // bs
        if product < 1 or 32 * min(block_sizes) % bs:
            raise ValueError(f"block sizes {block_sizes}: {bs} does not divide the page")
        taken = {s for s, b in zip(shapes, block_sizes) if b == bs}
        for heads in (2, 1, 4, 8, 16, 32):  # (2, 16), (1, 32), (4, 8) at the smallest block
            if product % heads == 0 and (heads, product // heads) not in taken:
                shapes.append((heads, product // heads))
                break
        else:
            raise ValueError(f"block sizes {block_sizes}: no distinct head shape left for {bs}")
    return shapes


def _kv_transfer_config(cfg: EngineConfig, engine_id: str, fs_root: str,
                        row_bytes: int) -> KVTransferConfig:
    """The connector to load (observed or stock) and the offloading spec it builds:
    the CPU-copy specs of :mod:`kvscope.sim.cpu_worker`, sized in primary-tier rows."""
    extra: dict[str, Any] = {
        "spec_name": "CPUSimTieringSpec" if cfg.tiering else "CPUSimOffloadingSpec",
        "spec_module_path": cpu_worker.__name__,
        "cpu_bytes_to_use": cfg.rows * row_bytes,
        # one chunk = one block of each group ("block_size" needs one block size for all)
        **({"blocks_per_chunk": 1} if cfg.group_block_sizes else {"block_size": cfg.block_size}),
        "kvscope": {"checksum_policy": cfg.checksum_policy,
                    "exporter_port": cfg.exporter_port, **cfg.kvscope_options},
        **cfg.offload_options,
    }
    observed = cfg.connector == "ObservedOffloadingConnector"
    if not observed:
        extra.pop("kvscope")
    if cfg.tiering:
        extra["secondary_tiers"] = [{"type": "fs", "root_dir": fs_root,
                                     "n_read_threads": 1, "n_write_threads": 1}]
    name, module = cfg.connector, ("kvscope.connector" if observed else
                                   "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector")
    if cfg.fault_hooks or cfg.fault is not None:
        if not observed or cfg.connector_by_name:
            raise ValueError("fault hooks need kvscope's connector, loaded by module path")
        name, module = "FaultInjectingConnector", "kvscope.sim.fault_connector"
    if cfg.connector_by_name:
        module = None
    return KVTransferConfig(kv_connector=name, kv_role="kv_both",
                            kv_connector_module_path=module,
                            engine_id=engine_id,
                            kv_load_failure_policy=cfg.kv_load_failure_policy,
                            kv_connector_extra_config=extra)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m
