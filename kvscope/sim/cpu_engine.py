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
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
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
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvscope.sim import cpu_worker, harness_compat
from kvscope.sim.cpu_model import PatternModel, prompt, write_tiny_llama
from kvscope.sim.promotion_delay import DelayedPromotions

__all__ = ["CPUEngine", "EngineConfig", "Finished", "Rank", "prompt", "sweep_leftovers"]

# Engines of this process not yet closed: (temp dir, engine id). A process
# stopped mid-run (SIGTERM in `kvscope demo`) sweeps exactly these, never
# another process's files.
_OPEN: dict[int, tuple[str, str]] = {}


def _remove(tmp: str, engine_id: str) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    # vLLM unlinks its /dev/shm region when the creator shuts down; a region
    # whose creator never got there (or a rank's own, "-nodeN") would stay.
    for path in glob.glob(f"/dev/shm/vllm_offload_{glob.escape(engine_id)}*.mmap"):
        try:
            os.unlink(path)
        except OSError:
            pass


def sweep_leftovers() -> int:
    """Remove the temp dirs and /dev/shm regions of engines this process did not
    close; returns how many engines that was."""
    left = list(_OPEN.items())
    for key, (tmp, engine_id) in left:
        _remove(tmp, engine_id)
        _OPEN.pop(key, None)
    return len(left)


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
    num_gpu_blocks: int = 128
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 8
    max_model_len: int = 4096
    own_region_ranks: tuple[int, ...] = ()  # ranks with their own /dev/shm region
    stuck: Callable[[int, str, int], bool] | None = None  # (rank, kind, job id) -> never report
    checksum_policy: str = "refuse"
    kv_load_failure_policy: str = "recompute"
    exporter_port: int | None = None
    kvscope_options: dict[str, Any] = field(default_factory=dict)  # more kvscope settings
    connector: str = "ObservedOffloadingConnector"  # or "OffloadingConnector" (stock)
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


@dataclass
class Rank:
    rank: int
    connector: Any
    kv: dict[str, torch.Tensor]


@dataclass
class Finished:
    request_id: str
    output: list[int]
    num_cached_tokens: int
    num_external_tokens: int


@dataclass
class CPUEngine:
    cfg: EngineConfig
    scheduler: Scheduler = field(init=False)
    ranks: list[Rank] = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        self._tmp = tempfile.mkdtemp(prefix="kvscope-engine-")
        self.engine_id = f"kvscope-{uuid.uuid4().hex[:12]}"
        _OPEN[id(self)] = (self._tmp, self.engine_id)
        self.fs_root = cfg.fs_root or os.path.join(self._tmp, "fs")
        model_dir = cfg.model_dir or os.path.join(self._tmp, "model")
        if not os.path.exists(os.path.join(model_dir, "config.json")):
            write_tiny_llama(model_dir, cfg.num_layers * cfg.kv_groups, cfg.max_model_len)

        self.layers = [f"model.layers.{i}.self_attn.attn"
                       for i in range(cfg.num_layers * cfg.kv_groups)]
        spec = FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=2, head_size=16,
                                 dtype=torch.float16)
        self.page = spec.page_size_bytes
        self.model = PatternModel(self.layers, cfg.kv_groups, cfg.block_size, self.page,
                                  cfg.sliding_window)
        # Groups of one attention kind with distinct head shapes (same page size):
        # vLLM keeps them as separate KV-cache groups, each with its own keys.
        shapes = ((2, 16), (1, 32), (4, 8))  # (kv heads, head size)
        group_specs = [FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=shapes[g][0],
                                         head_size=shapes[g][1], dtype=torch.float16)
                       for g in range(cfg.kv_groups)]
        if cfg.sliding_window is not None:
            last = group_specs[-1]
            group_specs[-1] = SlidingWindowSpec(
                block_size=cfg.block_size, num_kv_heads=last.num_kv_heads,
                head_size=last.head_size, dtype=torch.float16, sliding_window=cfg.sliding_window)
        groups = [KVCacheGroupSpec(self.layers[g::cfg.kv_groups], group_specs[g])
                  for g in range(cfg.kv_groups)]
        self.kv_cache_config = KVCacheConfig(
            num_blocks=cfg.num_gpu_blocks,
            kv_cache_tensors=harness_compat.kv_cache_tensors(self.layers, cfg.num_gpu_blocks,
                                                             self.page),
            kv_cache_groups=groups)
        worker_bytes_per_block = self.page * len(self.layers)
        row_bytes = _round_up(worker_bytes_per_block * cfg.world_size, 4096)
        self.row_bytes = row_bytes
        extra: dict[str, Any] = {
            "spec_name": "CPUSimTieringSpec" if cfg.tiering else "CPUSimOffloadingSpec",
            "spec_module_path": cpu_worker.__name__,
            "cpu_bytes_to_use": cfg.rows * row_bytes,
            "block_size": cfg.block_size,
            "kvscope": {"checksum_policy": cfg.checksum_policy,
                        "exporter_port": cfg.exporter_port, **cfg.kvscope_options},
        }
        if cfg.connector != "ObservedOffloadingConnector":
            extra.pop("kvscope")
        if cfg.tiering:
            extra["secondary_tiers"] = [{"type": "fs", "root_dir": self.fs_root,
                                         "n_read_threads": 1, "n_write_threads": 1}]
        module = ("kvscope.connector" if cfg.connector == "ObservedOffloadingConnector"
                  else "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector")
        ktc = KVTransferConfig(kv_connector=cfg.connector, kv_role="kv_both",
                               kv_connector_module_path=module,
                               engine_id=self.engine_id,
                               kv_load_failure_policy=cfg.kv_load_failure_policy,
                               kv_connector_extra_config=extra)
        model_config = ModelConfig(model=model_dir, tokenizer=None, skip_tokenizer_init=True,
                                   dtype="float16", max_model_len=cfg.max_model_len, seed=0)
        # Ranks are simulated in this process; the offload geometry (rank slots
        # per row) follows the configured world size.
        parallel = ParallelConfig(tensor_parallel_size=cfg.world_size)
        self.vllm_config = VllmConfig(
            model_config=model_config,
            cache_config=CacheConfig(block_size=cfg.block_size, enable_prefix_caching=True),
            scheduler_config=SchedulerConfig(
                max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                max_model_len=cfg.max_model_len, is_encoder_decoder=False,
                async_scheduling=False),
            parallel_config=parallel,
            device_config=DeviceConfig(device="cpu"),
            kv_transfer_config=ktc)
        self.vllm_config.cache_config.num_gpu_blocks = cfg.num_gpu_blocks

        with _hash_seed_env(cfg.hash_seed):
            init_none_hash(sha256)  # vLLM's engine core does this at start, from the env
        self._block_hasher = get_request_block_hasher(cfg.block_size, sha256)

        self.scheduler = Scheduler(
            vllm_config=self.vllm_config, kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=cfg.block_size, log_stats=True)
        self.connector = self.scheduler.connector
        self.ranks = []
        for r in range(cfg.world_size):
            with cpu_worker.simulated_rank(r, cfg.own_region_ranks, cfg.stuck):
                conn = type(self.connector)(self.vllm_config, KVConnectorRole.WORKER,
                                            self.kv_cache_config)
                kv = {name: torch.zeros((cfg.num_gpu_blocks, self.page), dtype=torch.int8)
                      for name in self.layers}
                conn.register_kv_caches(kv)
            self.ranks.append(Rank(r, conn, kv))
        self._aggregator = KVOutputAggregator(cfg.world_size)
        self._delayed = [DelayedPromotions(pool, cfg.promotion_delay_steps)
                         for pool in self._tier_pools()] if cfg.promotion_delay_steps else []
        self.stat_logger = None
        if cfg.vllm_metrics:
            from vllm.v1.metrics.loggers import PrometheusStatLogger

            self.stat_logger = PrometheusStatLogger(self.vllm_config, [0])
        self._req_counter = 0
        self._outputs: dict[str, list[int]] = {}
        self._prefill: dict[str, Any] = {}
        self.finished: dict[str, Finished] = {}
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
        self._outputs[rid] = []
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
        """Bring kvscope's gauges up to date now (they refresh at most every 50 ms
        while busy); a no-op with the stock connector."""
        observer = getattr(self.connector, "_kvscope_observer", None)
        if observer is not None:
            observer.refresh()

    # ---- one engine step -----------------------------------------------------------------
    def step(self) -> None:
        t0 = time.thread_time()  # CPU time of this thread: immune to other processes
        so = self.scheduler.schedule()
        self.scheduler_seconds += time.thread_time() - t0
        meta = so.kv_connector_metadata
        for rank in self.ranks:
            c = rank.connector
            if meta is not None:
                c.handle_preemptions(meta)
                c.bind_connector_metadata(meta)
                c.start_load_kv(None)
            self.model.forward(self.scheduler, so, rank.rank, rank.kv)
        # after every rank's forward, as one TP step
        sampled = self.model.sample_all(self.scheduler, so, [rank.kv for rank in self.ranks])
        if self.cfg.settle_tiers:
            for delayed in self._delayed:
                delayed.tick()
            self._settle_tiers()
        outputs = []
        for rank in self.ranks:
            c = rank.connector
            fs, fr, failed = harness_compat.finish_step(c, so.finished_req_ids)
            out = harness_compat.connector_output(
                failed, finished_sending=fs or None, finished_recving=fr or None,
                invalid_block_ids=c.get_block_ids_with_load_errors(),
                kv_connector_stats=c.get_kv_connector_stats(),
                kv_connector_worker_meta=c.build_connector_worker_meta())
            if meta is not None:
                c.clear_connector_metadata()
            outputs.append(ModelRunnerOutput(
                req_ids=list(so.num_scheduled_tokens),
                req_id_to_index={r: i for i, r in enumerate(so.num_scheduled_tokens)},
                sampled_token_ids=sampled, kv_connector_output=out))
        merged = self._aggregator.aggregate(outputs)
        t0 = time.thread_time()
        engine_outputs = self.scheduler.update_from_output(so, merged)
        self.scheduler_seconds += time.thread_time() - t0
        self._collect(engine_outputs)
        if self.stat_logger is not None:
            for eco in engine_outputs.values():
                if eco.scheduler_stats is not None:
                    self.stat_logger.record(eco.scheduler_stats, None, engine_idx=0)
        self.steps += 1
        time.sleep(self.cfg.step_time_s)

    def _tier_pools(self) -> list[Any]:
        """The secondary tiers' I/O thread pools (the fs tier's)."""
        manager = getattr(self.connector.connector_scheduler, "manager", None)
        return [t._pool for t in getattr(manager, "secondary_tiers", ()) or ()
                if getattr(t, "_pool", None) is not None]

    def _settle_tiers(self) -> None:
        """Let the secondary tiers' I/O of this step finish before the next step.

        Models disk I/O faster than one forward and makes scenarios repeatable:
        the fs tier's jobs (promotions, cascades) and its async existence checks,
        both started by this step's ``on_schedule_end``, are done when the next
        step looks up. Completions are left where vLLM collects them.
        """
        manager = getattr(self.connector.connector_scheduler, "manager", None)
        for tier in getattr(manager, "secondary_tiers", ()) or ():
            pool = getattr(tier, "_pool", None)
            if pool is not None:
                pool.wait_idle()
            lookups = getattr(tier, "_lookup_manager", None)
            if lookups is None:
                continue
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                lookups.drain_results()  # what vLLM's own next lookup() does first
                unflushed = {key for key, _ in lookups._lookup_batch}
                if all(st.result is not None or key in unflushed
                       for key, st in list(lookups._lookup_state.items())):
                    break
                time.sleep(0.0002)

    def _collect(self, engine_outputs) -> None:
        for eco in engine_outputs.values():
            for out in eco.outputs:
                self._outputs[out.request_id].extend(out.new_token_ids)
                if out.prefill_stats is not None:
                    self._prefill[out.request_id] = out.prefill_stats
                if out.finished:
                    ps = self._prefill.pop(out.request_id, None)
                    self.finished[out.request_id] = Finished(
                        out.request_id, list(self._outputs[out.request_id]),
                        int(getattr(ps, "num_cached_tokens", 0) or 0),
                        int(getattr(ps, "num_external_cached_tokens", 0) or 0))

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
        _remove(self._tmp, self.engine_id)
        _OPEN.pop(id(self), None)

    def __enter__(self) -> CPUEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m
