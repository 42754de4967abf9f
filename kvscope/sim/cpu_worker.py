"""What stands in for the GPU in the CPU harness: memcpy where a worker would DMA.

Each simulated rank's KV cache is a CPU tensor; :class:`CPUCopyWorker` implements
vLLM's ``OffloadingWorker`` interface by copying bytes between that tensor and the
rank's slot of the shared region (vLLM's own ``SharedOffloadRegion``). The spec
classes below are what the engine names in ``spec_name`` / ``spec_module_path``:
vLLM's offloading specs with the manager side unchanged and this worker.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvscope.connector.compat import renames
from kvscope.sim import harness_compat

# Which simulated rank a worker-role connector being built belongs to, and
# which ranks map a region of their own ("another node").
_SIM_RANK: contextvars.ContextVar[int] = contextvars.ContextVar("kvscope_sim_rank", default=0)
_SIM_OWN_REGION: contextvars.ContextVar[frozenset] = contextvars.ContextVar(
    "kvscope_sim_own_region", default=frozenset())
_SIM_STUCK: contextvars.ContextVar[Callable[[int, str, int], bool] | None] = contextvars.ContextVar(
    "kvscope_sim_stuck", default=None)
_SIM_FAILED: contextvars.ContextVar[Callable[[int, str, int], bool] | None] = contextvars.ContextVar(
    "kvscope_sim_failed", default=None)


class CPUCopyWorker(OffloadingWorker):
    """vLLM's OffloadingWorker interface, with memcpy where a GPU would DMA."""

    def __init__(self, kv_caches: Any, region: Any | None, rows: int,
                 slot_size: int, rank: int = 0,
                 stuck: Callable[[int, str, int], bool] | None = None,
                 failed: Callable[[int, str, int], bool] | None = None) -> None:
        self._rank = rank
        self._tensors = [t.tensor for t in kv_caches.tensors]
        self._group_refs = kv_caches.group_data_refs
        self._mmap_region = region
        if region is not None:
            self._views = [harness_compat.region_view(region, t.shape[1]) for t in self._tensors]
        else:  # CPU spec: each rank owns private host memory
            self._views = [torch.zeros((rows, t.shape[1]), dtype=torch.int8)
                           for t in self._tensors]
        self._slot_size = slot_size
        self._stuck = stuck
        self._failed = failed
        self._done: list[TransferResult] = []
        self._held: dict[int, TransferResult] = {}

    def _copy(self, job_id: int, kind: str, gpu_spec, cpu_spec, to_cpu: bool) -> bool:
        t0 = time.perf_counter()
        if self._failed is not None and self._failed(self._rank, kind, job_id):
            self._done.append(TransferResult(job_id, False))  # nothing copied
            return True
        gpu_blocks, sizes = harness_compat.gpu_blocks(gpu_spec, self._tensors, self._group_refs)
        rows = renames.row_ids(cpu_spec)
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

    def release_held(self) -> int:
        """Report every held transfer at the next ``get_finished`` (a slow transfer that
        completes at last); how many."""
        held, self._held = self._held, {}
        self._done.extend(held.values())
        return len(held)

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


@contextlib.contextmanager
def simulated_rank(rank: int, own_region_ranks: tuple[int, ...],
                   stuck: Callable[[int, str, int], bool] | None,
                   failed: Callable[[int, str, int], bool] | None = None) -> Iterator[None]:
    """While a worker-role connector of ``rank`` is built: which rank its worker copies
    for, whether it maps a region of its own, which of its transfers never report and
    which report failure."""
    tokens = (_SIM_RANK.set(rank), _SIM_OWN_REGION.set(frozenset(own_region_ranks)),
              _SIM_STUCK.set(stuck), _SIM_FAILED.set(failed))
    try:
        yield
    finally:
        _SIM_RANK.reset(tokens[0])
        _SIM_OWN_REGION.reset(tokens[1])
        _SIM_STUCK.reset(tokens[2])
        _SIM_FAILED.reset(tokens[3])


def _make_worker(spec, kv_caches, tiering: bool) -> CPUCopyWorker:
    rank = _SIM_RANK.get()
    region = None
    if tiering:
        engine_id = spec._engine_id
        if rank in _SIM_OWN_REGION.get():
            engine_id = f"{engine_id}-node{rank}"  # this rank's own /dev/shm, as on another host
        region = harness_compat.shared_region(engine_id, spec, rank)
    return CPUCopyWorker(kv_caches, region, renames.spec_rows_total(spec),
                         spec.cpu_page_size_per_worker,
                         rank, _SIM_STUCK.get(), _SIM_FAILED.get())


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
