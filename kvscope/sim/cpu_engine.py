"""A vLLM engine on CPU, for scenarios, tests and the demo: real scheduler, CPU ranks.

What is real: vLLM's ``Scheduler`` (request queues, KV-cache manager, prefix
cache, connector calls, stats), the offloading connector on both sides (the
class under test, scheduler and worker roles), ``TieringOffloadingManager`` with
its CPU primary tier in ``/dev/shm`` and the fs tier on disk, vLLM's
``KVOutputAggregator`` merging the ranks' outputs.

What stands in for the GPU: each rank's KV cache is a CPU tensor, and
:class:`CPUCopyWorker` implements vLLM's ``OffloadingWorker`` interface by
copying bytes between that tensor and the rank's slot of the shared region
(vLLM's own ``SharedOffloadRegion``), where the real worker would DMA. The
"model" writes a KV pattern derived from each token's prefix and samples the
next token from a digest of all KV bytes a request has on every rank, so a
restore with wrong bytes changes the output, as on a GPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import glob
import hashlib
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
from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvscope.connector.compat import harness, renames

VOCAB = 1024
# Which simulated rank a worker-role connector being built belongs to, and
# which ranks map a region of their own ("another node").
_SIM_RANK: contextvars.ContextVar[int] = contextvars.ContextVar("kvscope_sim_rank", default=0)
_SIM_OWN_REGION: contextvars.ContextVar[frozenset] = contextvars.ContextVar(
    "kvscope_sim_own_region", default=frozenset())
_SIM_STUCK: contextvars.ContextVar[Callable[[int, str, int], bool] | None] = contextvars.ContextVar(
    "kvscope_sim_stuck", default=None)


class CPUCopyWorker(OffloadingWorker):
    """vLLM's OffloadingWorker interface, with memcpy where a GPU would DMA."""

    def __init__(self, kv_caches: Any, region: Any | None, rows: int,
                 slot_size: int, rank: int = 0,
                 stuck: Callable[[int, str, int], bool] | None = None) -> None:
        self._rank = rank
        self._tensors = [t.tensor for t in kv_caches.tensors]
        self._group_refs = kv_caches.group_data_refs
        self._mmap_region = region
        if region is not None:
            self._views = [harness.region_view(region, t.shape[1]) for t in self._tensors]
        else:  # CPU spec: each rank owns private host memory
            self._views = [torch.zeros((rows, t.shape[1]), dtype=torch.int8)
                           for t in self._tensors]
        self._slot_size = slot_size
        self._stuck = stuck
        self._done: list[TransferResult] = []
        self._held: dict[int, TransferResult] = {}

    def _copy(self, job_id: int, kind: str, gpu_spec, cpu_spec, to_cpu: bool) -> bool:
        t0 = time.perf_counter()
        gpu_blocks = [int(b) for b in gpu_spec.block_ids]
        rows = [int(r) for r in cpu_spec.block_ids]
        sizes = list(gpu_spec.group_sizes) if gpu_spec.group_sizes else [len(gpu_blocks)]
        moved, i = 0, 0
        for group, n in enumerate(sizes):
            tensor_ids = {ref.tensor_idx for ref in self._group_refs[group]}
            for _ in range(n):
                g, r = gpu_blocks[i], rows[i]
                i += 1
                for t in tensor_ids:
                    if to_cpu:
                        self._views[t][r].copy_(self._tensors[t][g])
                    else:
                        self._tensors[t][g].copy_(self._views[t][r])
                    moved += self._tensors[t].shape[1]
        result = TransferResult(job_id, True, moved, time.perf_counter() - t0)
        if self._stuck is not None and self._stuck(self._rank, kind, job_id):
            self._held[job_id] = result  # never reported: a hung transfer
        else:
            self._done.append(result)
        return True

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        return self._copy(job_id, "store", src_spec, dst_spec, to_cpu=True)

    def submit_load(self, job_id, src_spec, dst_spec, expedited: bool = False) -> bool:
        # expedited (vLLM 0.33's sync loads): copies here complete at once anyway
        return self._copy(job_id, "load", dst_spec, src_spec, to_cpu=False)

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return None

    def shutdown(self) -> None:
        self._views = []
        if self._mmap_region is not None:
            self._mmap_region.cleanup()
            self._mmap_region = None


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


def _make_worker(spec, kv_caches, tiering: bool) -> CPUCopyWorker:
    rank = _SIM_RANK.get()
    region = None
    if tiering:
        engine_id = spec._engine_id
        if rank in _SIM_OWN_REGION.get():
            engine_id = f"{engine_id}-node{rank}"  # this rank's own /dev/shm, as on another host
        region = harness.shared_region(engine_id, spec, rank)
    return CPUCopyWorker(kv_caches, region, renames.spec_rows_total(spec),
                         spec.cpu_page_size_per_worker,
                         rank, _SIM_STUCK.get())


class CPUSimTieringSpec(TieringOffloadingSpec):
    """TieringOffloadingSpec whose worker copies on CPU (manager side unchanged)."""

    def get_worker(self, kv_caches):
        if getattr(self, "_sim_worker", None) is None:
            self._sim_worker = _make_worker(self, kv_caches, tiering=True)
        return self._sim_worker


class CPUSimOffloadingSpec(CPUOffloadingSpec):
    """CPUOffloadingSpec whose worker copies on CPU (manager side unchanged)."""

    def get_worker(self, kv_caches):
        if getattr(self, "_sim_worker", None) is None:
            self._sim_worker = _make_worker(self, kv_caches, tiering=False)
        return self._sim_worker


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
            _write_tiny_llama(model_dir, cfg.num_layers * cfg.kv_groups, cfg.max_model_len)

        self.layers = [f"model.layers.{i}.self_attn.attn"
                       for i in range(cfg.num_layers * cfg.kv_groups)]
        spec = FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=2, head_size=16,
                                 dtype=torch.float16)
        self.page = spec.page_size_bytes
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
            kv_cache_tensors=harness.kv_cache_tensors(self.layers, cfg.num_gpu_blocks,
                                                      self.page),
            kv_cache_groups=groups)
        worker_bytes_per_block = self.page * len(self.layers)
        row_bytes = _round_up(worker_bytes_per_block * cfg.world_size, 4096)
        self.row_bytes = row_bytes
        extra: dict[str, Any] = {
            "spec_name": "CPUSimTieringSpec" if cfg.tiering else "CPUSimOffloadingSpec",
            "spec_module_path": __name__,
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
            tokens = (_SIM_RANK.set(r), _SIM_OWN_REGION.set(frozenset(cfg.own_region_ranks)),
                      _SIM_STUCK.set(cfg.stuck))
            try:
                conn = type(self.connector)(self.vllm_config, KVConnectorRole.WORKER,
                                            self.kv_cache_config)
                kv = {name: torch.zeros((cfg.num_gpu_blocks, self.page), dtype=torch.int8)
                      for name in self.layers}
                conn.register_kv_caches(kv)
            finally:
                _SIM_RANK.reset(tokens[0])
                _SIM_OWN_REGION.reset(tokens[1])
                _SIM_STUCK.reset(tokens[2])
            self.ranks.append(Rank(r, conn, kv))
        self._aggregator = KVOutputAggregator(cfg.world_size)
        self.stat_logger = None
        if cfg.vllm_metrics:
            from vllm.v1.metrics.loggers import PrometheusStatLogger

            self.stat_logger = PrometheusStatLogger(self.vllm_config, [0])
        self._req_counter = 0
        self._outputs: dict[str, list[int]] = {}
        self._prefix_digest: dict[str, tuple[int, bytes]] = {}
        self._prefill: dict[str, Any] = {}
        self.finished: dict[str, Finished] = {}
        self.steps = 0
        # CPU time inside vLLM's Scheduler.schedule + update_from_output (the
        # scheduler step, connector calls included): what the overhead benchmark compares
        self.scheduler_seconds = 0.0

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt: list[int], max_tokens: int = 4) -> str:
        self._req_counter += 1
        rid = f"req-{self._req_counter}"
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        req = Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=sp,
                      pooling_params=None, block_hasher=self._block_hasher)
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

    def generate(self, prompt: list[int], max_tokens: int = 4, max_steps: int = 500) -> Finished:
        rid = self.add_request(prompt, max_tokens)
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
            self._forward(rank, so)
        sampled = self._sample_all(so)  # after every rank's forward, as one TP step
        if self.cfg.settle_tiers:
            self._settle_tiers()
        outputs = []
        for rank in self.ranks:
            c = rank.connector
            fs, fr, failed = harness.finish_step(c, so.finished_req_ids)
            out = harness.connector_output(
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

    def _forward(self, rank: Rank, so) -> None:
        """Write each scheduled token's KV pattern into this rank's blocks."""
        bs = self.cfg.block_size
        tok_bytes = self.page // bs
        for rid, n in so.num_scheduled_tokens.items():
            req = self.scheduler.requests[rid]
            end = req.num_computed_tokens  # already advanced by schedule()
            start = end - n
            tokens = req.all_token_ids
            block_ids = self.scheduler.kv_cache_manager.get_block_ids(rid)
            for pos in range(start, end):
                h = self._prefix_hash(rid, tokens, pos)
                for g, blocks in enumerate(block_ids):
                    for li, name in enumerate(self.layers[g::self.cfg.kv_groups]):
                        pattern = hashlib.blake2b(
                            h + bytes([rank.rank, g, li]), digest_size=16).digest()
                        reps = tok_bytes // len(pattern)
                        off = (pos % bs) * tok_bytes
                        rank.kv[name][blocks[pos // bs], off:off + tok_bytes] = torch.frombuffer(
                            bytearray(pattern * reps), dtype=torch.int8)

    def _prefix_hash(self, rid: str, tokens, pos: int) -> bytes:
        done, h = self._prefix_digest.get(rid, (0, b""))
        if pos < done:  # recompute from scratch (preemption / recompute)
            done, h = 0, b""
        for p in range(done, pos + 1):
            h = hashlib.blake2b(h + int(tokens[p]).to_bytes(4, "little"), digest_size=16).digest()
        self._prefix_digest[rid] = (pos + 1, h)
        return h

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

    def _sample_all(self, so) -> list[list[int]]:
        sampled = []
        for rid in so.num_scheduled_tokens:
            req = self.scheduler.requests[rid]
            sampled.append([self._sample(req)] if req.num_computed_tokens >= req.num_tokens
                           else [])
        return sampled

    def _sample(self, req) -> int:
        """Next token = digest of every KV byte this request has, on every rank."""
        h = hashlib.blake2b(digest_size=8)
        bs = self.cfg.block_size
        n = req.num_computed_tokens  # attention reads positions < n, nothing beyond
        tok_bytes = self.page // bs
        block_ids = self.scheduler.kv_cache_manager.get_block_ids(req.request_id)
        window = self.cfg.sliding_window
        for rank in self.ranks:
            for g, blocks in enumerate(block_ids):
                # a sliding-window layer attends to the last `window` positions only
                # (vLLM frees the blocks before them)
                first = (max(n - window + 1, 0) // bs
                         if window is not None and g == self.cfg.kv_groups - 1 else 0)
                for name in self.layers[g::self.cfg.kv_groups]:
                    for i, b in enumerate(blocks[:-(-n // bs)]):
                        if i < first:
                            continue
                        used = min(bs, n - i * bs) * tok_bytes
                        h.update(rank.kv[name][b, :used].numpy().tobytes())
        return int.from_bytes(h.digest(), "little") % VOCAB

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


def _write_tiny_llama(path: str, num_layers: int, max_len: int) -> None:
    """A config-only Llama (no weights): the scheduler needs the model's shape, not its values."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=max_len).save_pretrained(path)


def prompt(seed: int, n: int) -> list[int]:
    import random

    rnd = random.Random(seed)
    return [rnd.randrange(3, VOCAB) for _ in range(n)]
