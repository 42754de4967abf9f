"""Everything kvscope reads from vLLM's offload internals, in one place.

kvscope supports vLLM 0.26.0 .. 0.34.0 (the ``vllm`` extra). What differs
between releases is absorbed in this package and nowhere else, one module per
difference, each naming the release that needs it:

* ``renames``: 0.33 calls primary-tier rows chunks (``num_chunks``, ``chunk_ids``).
* ``tiers``: what each tier holds (cache policy, fs files, existence checks), read only.
* ``prefix_scan``: where a round's lookups can be read from the connector scheduler's
  prefix scan (its name and contract, the same in 0.26 and 0.33; 0.33's partial-tail
  lookups rule it out).
* ``load_failures``: how a refused load reaches vLLM; 0.33's request-level
  ``failed_recving`` for models with several KV groups; 0.34's failed transfer jobs.
* ``block_pool``: vLLM's GPU KV-cache block pool as the scheduler binds it (0.26:
  ``bind_gpu_block_pool``; 0.33: ``bind_kv_cache_manager``, which calls it), read only.
* ``device_pointers``: 0.34 hands a worker's transfers device addresses, not GPU block ids.
* ``skip_reading``: the request attribute that skips the connector's lookup (0.34 renamed it).
* ``hash_lookahead``: 0.34's lookahead block hashes (an EAGLE/MTP drafter's trailing chunk
  keyed with the tokens after it), which changed such a model's keys; and how each release
  keys a drafter's group (``kvscope_kv_group_info{drafter}``).
* ``store_after_finish``: vLLM 0.26's ``TieringOffloadingManager.prepare_store`` raising
  ``KeyError`` for a request whose state it already deleted (fixed in 0.27.0): the version
  gate and the reads ``connector/contained_faults.py`` needs to skip that one store.
* ``registry``: naming the connector to vLLM's connector factory (the ``vllm.general_plugins``
  entry point, ``kvscope.connector.plugin``); the same API in 0.26 and 0.33.
* The CPU harness has its own (``kvscope.sim.harness_compat``: 0.33's ``KVCacheTensor``
  placement, ``SharedOffloadRegion`` sizes, ``get_transfer_results``).
* ``vllm_api``: the vLLM classes the connector subclasses or builds, and named hooks for
  the private ones it must touch (declaring kvscope's metrics on vLLM's offload
  Prometheus metrics, the bound connector metadata, NONE_HASH).
  ``tests/unit/test_compat_boundary.py`` fails when vLLM is imported, or a private
  attribute kvscope did not define is touched, outside this package (the CPU harness
  and the test-only fault hooks excepted).
* lookup results: a tiering lookup that starts a promotion answers RETRY in 0.26
  and HIT_PENDING in 0.33; both count as pending keys (``Round.pending_keys``),
  so the deferred and row-ceiling verdicts mean the same on both.

Private attributes are read only here, always with a fallback; the one write is
``vllm_api.declare_offload_metric`` (vLLM's own way to declare offload metrics).
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable, Iterable
from typing import Any

from vllm.v1.kv_offload.base import LookupResult as VLookupResult

from kvscope.connector.compat import hash_lookahead, renames, skip_reading
from kvscope.connector.compat.block_pool import gpu_blocks_in_use
from kvscope.connector.compat.prefix_scan import (
    SCAN_METHOD,
    TieredReader,
    promotion_extends_window,
    scan_reader,
    tiered_scan_reader,
)
from kvscope.connector.compat.tiers import (
    bound_once,
    held_prefix,
    primary_holds,
    primary_key_count,
    primary_keys,
    primary_tier,
    secondary_file_identity,
    secondary_holds,
    secondary_tiers,
    tier_home,
    tier_type,
)
from kvscope.connector.compat.versions import VLLM_VERSION
from kvscope.exporters import signals

__all__ = [
    "SCAN_METHOD", "TieredReader", "VLLM_VERSION", "bound_once", "gpu_blocks_in_use",
    "held_prefix",
    "primary_holds", "primary_key_count", "primary_keys", "primary_tier", "scan_reader",
    "secondary_file_identity",
    "secondary_holds", "secondary_tiers", "tier_home", "tier_type", "tiered_scan_reader",
]

MISS = VLookupResult.MISS
HIT = VLookupResult.HIT
RETRY = VLookupResult.RETRY
HIT_PENDING = VLookupResult.HIT_PENDING
LOOKUP_RESULT: dict[Any, signals.LookupResult] = {
    VLookupResult.HIT: signals.LookupResult.HIT,
    VLookupResult.MISS: signals.LookupResult.MISS,
    VLookupResult.RETRY: signals.LookupResult.RETRY,
    VLookupResult.HIT_PENDING: signals.LookupResult.HIT_PENDING,
}

# Attribute an instrumented object carries so wrapping twice is a no-op.
WRAPPED_MARK = "_kvscope_wrapped"
# Attribute on a CPU load spec carrying the expected per-rank row digests.
EXPECTED_DIGESTS_ATTR = "kvscope_expected_digests"


# make_offload_key appends the KV-group index as 4 big-endian bytes.
GROUP_SUFFIX_BYTES = 4


def rows_total(primary: Any) -> int:
    """row_states(primary)[0] alone."""
    return renames.primary_total(primary)


def row_states(primary: Any) -> tuple[int, int, int]:
    """(total, occupied, in_flight) rows of a CPUOffloadingManager."""
    total, allocated, in_flight = renames.primary_counters(primary)
    free = len(getattr(primary, "_free_list", ()))
    return total, max(allocated - free, 0), in_flight


def evictable_rows(primary: Any) -> int | None:
    """Rows of a CPUOffloadingManager an allocation may evict now (None: not kept)."""
    return renames.primary_evictable(primary)


def connector_jobs(connector_scheduler: Any) -> Iterable[tuple[int, bool]]:
    """(job id, is_store) of connector jobs not yet reported by every rank."""
    jobs = getattr(connector_scheduler, "_jobs", {}) or {}
    return [(jid, bool(getattr(st, "is_store", False))) for jid, st in list(jobs.items())]


def connector_job_map(connector_scheduler: Any) -> dict | None:
    """The offloading scheduler's own dict of connector jobs not yet reported by every rank
    (kept for the connector's life in 0.26 and 0.33: cleared, never replaced), for a check
    of its emptiness without a copy; None when not a dict."""
    jobs = getattr(connector_scheduler, "_jobs", None)
    return jobs if isinstance(jobs, dict) else None


def job_rows(job: Any) -> list[int]:
    return renames.row_ids(job)


def job_keys(job: Any) -> list[bytes]:
    return list(getattr(job, "keys", ()) or ())


def job_key_count(job: Any) -> int:
    return len(getattr(job, "keys", ()) or ())


def job_row_count(job: Any) -> int:
    return renames.row_count(job)


def spec_rows(spec: Any) -> list[int]:
    """Row (CPU block) ids of a CPU load/store spec, or GPU block ids of a GPU spec."""
    return job_rows(spec)


class RegionGeometry:
    """Where rows and rank slots live in the primary tier's shared region."""

    def __init__(self, rows: int, row_stride: int, slot_size: int, world_size: int) -> None:
        self.rows = rows
        self.row_stride = row_stride
        self.slot_size = slot_size
        self.world_size = world_size

    def slot_offset(self, row: int, rank: int) -> int:
        return row * self.row_stride + rank * self.slot_size


def region_geometry(spec: Any) -> RegionGeometry | None:
    rows = renames.spec_rows_total(spec)
    row_stride = int(getattr(spec, "kv_bytes_per_chunk", 0) or 0)
    slot = int(getattr(spec, "cpu_page_size_per_worker", 0) or 0)
    if not (rows and row_stride and slot):
        return None
    world = int(getattr(getattr(getattr(spec, "config", None), "parallel", None),
                        "world_size", 1) or 1)
    return RegionGeometry(rows, row_stride, slot, world)


def world_size(spec: Any, vllm_config: Any) -> int | None:
    """The worker ranks of this engine whose slots make one row (the offload config's
    ``parallel.world_size``, else vLLM's ``parallel_config.world_size``); None when
    neither says. Worker-side series carry ``rank`` = 0 .. world_size - 1."""
    for parallel in (getattr(getattr(spec, "config", None), "parallel", None),
                     getattr(vllm_config, "parallel_config", None)):
        try:
            n = int(getattr(parallel, "world_size", 0) or 0)
        except (TypeError, ValueError):
            continue
        if n > 0:
            return n
    return None


def scheduler_view(manager: Any) -> memoryview | None:
    """The scheduler's view of the primary tier as flat bytes (tiering only)."""
    getter = getattr(primary_tier(manager), "get_kv_memoryview", None)
    return getter().cast("B") if getter is not None else None


def scheduler_region(manager: Any) -> Any | None:
    """The SharedOffloadRegion the scheduler's primary tier maps (tiering; 0.26 and 0.33
    keep it as ``_mmap_region``), or None."""
    return getattr(primary_tier(manager), "_mmap_region", None)


def worker_region(worker: Any) -> Any | None:
    """The SharedOffloadRegion a CPU offloading worker maps for its own rank.

    vLLM 0.26's CPUOffloadingWorker hands it to its store handler (the handler
    that cleans it up); simpler workers keep it themselves.
    """
    for owner in (worker, getattr(worker, "_store_handler", None)):
        region = getattr(owner, "_mmap_region", None) or getattr(owner, "mmap_region", None)
        if region is not None:
            return region
    return None


def region_rank(region: Any) -> int | None:
    rank = getattr(region, "rank", None)
    return int(rank) if rank is not None else None


def region_file(region: Any) -> tuple[int | None, str | None]:
    """(fd, path) of the file a SharedOffloadRegion maps (``/dev/shm/vllm_offload_<engine>
    .mmap``; in 0.33 its first segment, which every mapper opens by that path); None where
    the region does not say."""
    fd, path = getattr(region, "fd", None), getattr(region, "mmap_path", None)
    return (fd if isinstance(fd, int) else None), (path if isinstance(path, str) else None)


def region_buffer(region: Any) -> mmap.mmap | None:
    return getattr(region, "mmap_obj", None)


def process_rank() -> int:
    """This worker's rank when no shared region says it (CPU spec without tiering)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:
        return 0


def hash_fingerprint(vllm_config: Any) -> str:
    """Short digest of the prefix-hash configuration (hash algorithm + NONE_HASH, and
    vLLM 0.34's lookahead tokens where there are any).

    vLLM 0.26 seeds NONE_HASH from PYTHONHASHSEED, or from os.urandom when it is
    unset: two processes (or one process before and after a restart) with
    different fingerprints compute different keys for the same tokens, so one
    never hits what the other stored. vLLM 0.34 with an EAGLE/MTP drafter hashes
    each block with the tokens after it (``hash_lookahead``): an upgrade from 0.33
    with such a drafter changes every key, so it changes the fingerprint too.
    """
    from vllm.v1.core import kv_cache_utils

    none_hash = getattr(kv_cache_utils, "NONE_HASH", None)
    algo = getattr(getattr(vllm_config, "cache_config", None), "prefix_caching_hash_algo", "")
    if none_hash is None:
        return "unset"
    lookahead = hash_lookahead.lookahead_tokens(vllm_config)
    extra = f"lookahead={lookahead}".encode() if lookahead else b""
    return hashlib.blake2b(bytes(none_hash) + str(algo).encode() + extra,
                           digest_size=4).hexdigest()


def kv_group_kinds(kv_cache_config: Any) -> list[str]:
    kinds = []
    for group in getattr(kv_cache_config, "kv_cache_groups", ()) or ():
        spec = group.kv_cache_spec
        name = type(spec).__name__
        if "SlidingWindow" in name:
            kinds.append("sliding_window")
        elif "Mamba" in name:
            kinds.append("mamba")
        elif "FullAttention" in name or "MLA" in name:
            kinds.append("full_attention")
        else:
            kinds.append(name.removesuffix("Spec").lower() or "unknown")
    return kinds


def restore_chunks(kv_cache_config: Any, tokens_per_chunk: list[int]) -> list[int]:
    """Per KV group, the most chunks one restore from a secondary tier promotes into the
    primary tier: a sliding-window group's window, a chunk for a partial last one and, for an
    EAGLE/MTP drafter's group, the extra chunk vLLM looks up for it, where its lookup stops
    there (:func:`promotion_extends_window`); else 0: every chunk of the prefix (full
    attention, or a window scan that promotes all it passes)."""
    window = promotion_extends_window()
    out = []
    for g, group in enumerate(getattr(kv_cache_config, "kv_cache_groups", ()) or ()):
        tokens = int(getattr(group.kv_cache_spec, "sliding_window", 0) or 0)
        chunk = tokens_per_chunk[g] if g < len(tokens_per_chunk) else 0
        extra = 2 if getattr(group, "is_eagle_group", False) else 1
        out.append(-(-tokens // chunk) + extra if window and tokens > 0 and chunk > 0 else 0)
    return out


def group_tokens_per_block(spec: Any) -> list[int]:
    return [int(t) for t in (getattr(spec, "tokens_per_block", ()) or ())]


def blocks_per_chunk(spec: Any) -> int:
    return int(getattr(spec, "blocks_per_chunk", 1) or 1)


def scheduler_spec(manager: Any, vllm_config: Any, kv_cache_config: Any) -> Any:
    """The OffloadingSpec the scheduler's manager came from.

    0.26's connector does not keep it; a secondary tier does. Without tiers it is
    rebuilt through vLLM's public factory (construction has no side effects; only
    get_manager/get_worker allocate).
    """
    for tier in secondary_tiers(manager):
        spec = getattr(tier, "_offloading_spec", None)
        if spec is not None:
            return spec
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    return OffloadingSpecFactory.create_spec(build_offloading_config(vllm_config, kv_cache_config))


# ---- restore coverage (read only; called once per ended lookup round) -------------------
def lookup_groups(connector_scheduler: Any) -> list[tuple[int, bool]]:
    """(tokens per chunk, is sliding window) of each KV group, as the connector scans them."""
    configs = getattr(getattr(connector_scheduler, "config", None), "kv_group_configs", ()) or ()
    return [(int(getattr(c, "tokens_per_chunk", 0) or 0),
             getattr(c, "sliding_window_size_in_chunks", None) is not None) for c in configs]


def group_chunk_tokens(connector_scheduler: Any) -> dict[int, int]:
    """Tokens per chunk of each KV group the connector offloads, by the group index its keys
    carry (``make_offload_key``'s suffix: ``group_idx``; 0.33 offloads only the
    prefix-cacheable groups, so indexes may skip)."""
    configs = getattr(getattr(connector_scheduler, "config", None), "kv_group_configs", ()) or ()
    return {int(getattr(c, "group_idx", i)): int(getattr(c, "tokens_per_chunk", 0) or 0)
            for i, c in enumerate(configs)}


def group_of_suffix(suffix: bytes) -> int:
    """The KV group index a key's last GROUP_SUFFIX_BYTES name (big-endian)."""
    return int.from_bytes(suffix, "big")


# True on a request that asked not to read cached KV (on by default with
# ``prompt_logprobs``): vLLM's GPU prefix cache and the offloading connector's lookup
# both answer it with no hit, without looking. Read with getattr(request, ..., False)
# (once per lookup round: scheduler/hooks.py, no function call around it); its name moved
# in 0.34 (``skip_reading``).
SKIP_PREFIX_CACHE_ATTR = skip_reading.attribute()


def request_statuses(connector_scheduler: Any) -> dict[str, Any] | None:
    """vLLM's offloading connector's per-request states by request id (its own dict, kept
    for the connector's life: a request enters at ``on_new_request`` and leaves once
    finished with no transfer in flight, in 0.26 and 0.33); None when not a dict. Only
    the scheduler thread changes it."""
    statuses = getattr(connector_scheduler, "_req_status", None)
    return statuses if isinstance(statuses, dict) else None


def request_offload_keys(connector_scheduler: Any, req_id: str) -> list[list[bytes]] | None:
    """Per KV group, the offload keys of a request's full chunks (what the lookup scans)."""
    status = (request_statuses(connector_scheduler) or {}).get(req_id)
    if status is None:
        return None
    return [getattr(g, "offload_keys", None) or [] for g in getattr(status, "group_states", ())]


def offload_prefix_capture(connector_scheduler: Any
                           ) -> Callable[[str], tuple[Any, int | tuple[int, ...] | None]]:
    """A function of a request id: :func:`request_offload_keys` captured for later, the
    key list(s) (vLLM only appends to them) and their length(s) now: one KV group's list
    and its length (an int: nothing built but the pair returned), else the per-group
    lists and a tuple of lengths; ``(None, None)`` for an unknown request. A reader on
    another thread takes ``keys[:n]``: the prefix that existed at the capture. Once per
    lookup round on the scheduler thread: the status dict's ``get`` bound once (vLLM
    keeps that dict for the connector's life)."""
    statuses = request_statuses(connector_scheduler)
    if statuses is None:
        def capture_generic(req_id: str):
            keys = request_offload_keys(connector_scheduler, req_id)
            return (None, None) if keys is None else (keys, tuple(map(len, keys)))
        return capture_generic
    get = statuses.get

    def capture(req_id: str):
        status = get(req_id)
        if status is None:
            return None, None
        states = status.group_states
        if len(states) == 1:  # one KV group (most models): its list, no comprehension
            keys = states[0].offload_keys
            return keys, len(keys)
        keys = [g.offload_keys for g in states]
        return keys, tuple(map(len, keys))

    return capture
