"""A vLLM engine on CPU, for scenarios, tests and the demo: real scheduler, CPU ranks.

What is real: vLLM's ``Scheduler`` (request queues, KV-cache manager, prefix
cache, connector calls, stats), the offloading connector on both sides (the
class under test, scheduler and worker roles), ``TieringOffloadingManager`` with
its CPU primary tier in ``/dev/shm`` and the fs tier on disk, vLLM's
``KVOutputAggregator`` merging the ranks' outputs.

What stands in for the GPU: each rank's KV cache is a CPU tensor, and
:class:`~kvscope.sim.cpu_worker.CPUCopyWorker` copies bytes between that tensor and
the rank's slot of the shared region where the real worker would DMA. The
model (:mod:`kvscope.sim.cpu_model`) writes a KV pattern derived from each token's
prefix and samples the next token from a digest of all KV bytes a request has on
every rank, so a restore with wrong bytes changes the output, as on a GPU.

This module builds the engine and drives its requests; its other rooms:
:mod:`~kvscope.sim.engine_config` (the knobs and the vLLM configs they become),
:mod:`~kvscope.sim.engine_step` (one step), :mod:`~kvscope.sim.engine_results` (what
each request got) and :mod:`~kvscope.sim.engine_leftovers` (files of unclosed engines).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvscope.sim import cpu_worker, engine_leftovers, harness_compat
from kvscope.sim.cpu_model import PatternModel, prompt, write_tiny_llama
from kvscope.sim.engine_config import EngineConfig, build_vllm_configs
from kvscope.sim.engine_leftovers import sweep_leftovers
from kvscope.sim.engine_results import Finished, RequestResults
from kvscope.sim.engine_step import EngineStepping, Rank
from kvscope.sim.promotion_delay import CompletionsAtStepEnd, DelayedPromotions

__all__ = ["CPUEngine", "EngineConfig", "Finished", "Rank", "prompt", "sweep_leftovers"]


@dataclass
class CPUEngine(EngineStepping):
    cfg: EngineConfig
    scheduler: Scheduler = field(init=False)
    ranks: list[Rank] = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        self._tmp = tempfile.mkdtemp(prefix="kvscope-engine-")
        self.engine_id = f"kvscope-{uuid.uuid4().hex[:12]}"
        engine_leftovers.track(id(self), self._tmp, self.engine_id)
        self.fs_root = cfg.fs_root or os.path.join(self._tmp, "fs")
        model_dir = cfg.model_dir or os.path.join(self._tmp, "model")
        if not os.path.exists(os.path.join(model_dir, "config.json")):
            write_tiny_llama(model_dir, cfg.num_layers * cfg.kv_groups, cfg.max_model_len)

        built = build_vllm_configs(cfg, self.engine_id, self.fs_root, model_dir)
        self.layers, self.page, self.row_bytes = built.layers, built.page, built.row_bytes
        self.kv_cache_config, self.vllm_config = built.kv_cache_config, built.vllm_config
        self.model = PatternModel(self.layers, cfg.kv_groups, cfg.block_sizes, self.page,
                                  cfg.sliding_window)
        # vLLM's engine core: the scheduler's block (the groups' lcm) and hash block (gcd)
        sched_block, hash_block = resolve_kv_cache_block_sizes(self.kv_cache_config,
                                                               self.vllm_config)

        with _hash_seed_env(cfg.hash_seed):
            init_none_hash(sha256)  # vLLM's engine core does this at start, from the env
        self._block_hasher = harness_compat.request_block_hasher(hash_block, sha256,
                                                                  self.vllm_config)

        with _fault_env(cfg.fault, self._tmp):
            self.scheduler = Scheduler(
                vllm_config=self.vllm_config, kv_cache_config=self.kv_cache_config,
                structured_output_manager=StructuredOutputManager(self.vllm_config),
                block_size=sched_block, hash_block_size=hash_block, log_stats=True)
        self.connector = self.scheduler.connector
        self.ranks = []
        for r in range(cfg.world_size):
            with cpu_worker.simulated_rank(r, cfg.own_region_ranks, cfg.stuck, cfg.failed):
                conn = type(self.connector)(self.vllm_config, KVConnectorRole.WORKER,
                                            self.kv_cache_config)
                kv = {name: torch.zeros((cfg.num_gpu_blocks, self.page), dtype=torch.int8)
                      for name in self.layers}
                conn.register_kv_caches(kv)
            self.ranks.append(Rank(r, conn, kv))
        self._aggregator = KVOutputAggregator(cfg.world_size)
        self._delayed = [DelayedPromotions(pool, cfg.promotion_delay_steps)
                         for pool in self._tier_pools()] if cfg.promotion_delay_steps else []
        self._at_step_end = [CompletionsAtStepEnd(pool) for pool in self._tier_pools()
                             ] if cfg.settle_tiers else []
        self.stat_logger = None
        if cfg.vllm_metrics:
            from vllm.v1.metrics.loggers import PrometheusStatLogger

            self.stat_logger = PrometheusStatLogger(self.vllm_config, [0])
        self._req_counter = 0
        self._results = RequestResults()
        self.finished: dict[str, Finished] = self._results.finished
        self.steps = 0
        # CPU time inside vLLM's Scheduler.schedule + update_from_output (the
        # scheduler step, connector calls included): what the overhead benchmark compares
        self.scheduler_seconds = 0.0

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt: list[int], max_tokens: int = 4, *,
                    prompt_logprobs: int | None = None, cache_salt: str | None = None) -> str:
        self._req_counter += 1
        rid = f"req-{self._req_counter}"
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            prompt_logprobs=prompt_logprobs)
        req = Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=sp,
                      pooling_params=None, block_hasher=self._block_hasher,
                      cache_salt=cache_salt)
        self.scheduler.add_request(req)
        self._results.expect(rid)
        return rid

    def run_until_done(self, rids: list[str], max_steps: int = 500,
                       on_step: Callable[[CPUEngine], None] | None = None) -> int:
        start = self.steps
        while any(r not in self.finished for r in rids):
            if self.steps - start >= max_steps:
                raise TimeoutError(f"requests {rids} not done after {max_steps} steps")
            self.step()
            if on_step is not None:
                on_step(self)
        self.refresh()
        return self.steps - start

    def generate(self, prompt: list[int], max_tokens: int = 4, max_steps: int = 500,
                 **request: Any) -> Finished:
        rid = self.add_request(prompt, max_tokens, **request)
        self.run_until_done([rid], max_steps)
        return self.finished[rid]

    def drain(self, max_steps: int = 200) -> int:
        """Step until nothing is pending (stores reached every tier)."""
        n = 0
        while self.scheduler.has_requests() and n < max_steps:
            self.step()
            n += 1
            if not self.scheduler.has_requests():
                break
        if self._delayed:  # no step left to hand them over
            for delayed in self._delayed:
                delayed.release_all()
            self._settle_tiers()
        self.refresh()
        return n

    def refresh(self) -> None:
        """Bring kvscope's gauges up to date now (they refresh at most every
        ``flush_interval_s`` while busy, 1 s by default); a no-op with the stock connector."""
        observer = getattr(self.connector, "_kvscope_observer", None)
        if observer is not None:
            observer.refresh()

    # ---- teardown -------------------------------------------------------------------------
    def close(self) -> None:
        for rank in self.ranks:
            try:
                rank.connector.shutdown()
            except Exception:
                pass
        try:
            self.connector.shutdown()
        except Exception:
            pass
        engine_leftovers.close(id(self), self._tmp, self.engine_id)

    def __enter__(self) -> CPUEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def _fault_env(fault: str | None, folder: str) -> Iterator[None]:
    """``fault`` (kvscope.sim.faults) switched on in a file in ``folder`` and named by
    KVSCOPE_FAULT_FILE while the scheduler and its connector are built (their hooks keep
    the file's path), then the variable as it was; nothing without a fault."""
    if fault is None:
        yield
        return
    from kvscope.sim import faults

    path = os.path.join(folder, "fault.json")
    faults.write_fault(path, fault)
    before = os.environ.get(faults.ENV)
    os.environ[faults.ENV] = path
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(faults.ENV, None)
        else:
            os.environ[faults.ENV] = before


@contextlib.contextmanager
def _hash_seed_env(seed: str | None) -> Iterator[None]:
    """PYTHONHASHSEED = ``seed`` (None: unset) while vLLM derives NONE_HASH from it, then
    as it was: the environment belongs to the process that runs the harness."""
    before = os.environ.get("PYTHONHASHSEED")
    try:
        if seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = seed
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = before
