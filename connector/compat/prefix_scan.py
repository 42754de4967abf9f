"""Where a round's per-key lookups can be read from the prefix scan's answer.

vLLM 0.26 .. 0.33 scan a full-attention group's offload keys in one method of the
connector scheduler, ``_maximal_prefix_lookup(keys, req_context, ...)``: it looks keys
up in order, stops at the first MISS, and answers the number of hits, or None when a
key was pending (HIT_PENDING, RETRY: the lookup is deferred). So an answer of ``n``
means exactly: ``n`` HITs, then one MISS unless the scan reached the end of ``keys``.

A deferred answer does not say which keys were pending. vLLM's CPU manager answers a
lookup from its cache policy alone (``_policy.get``: absent MISS, not ready
HIT_PENDING, else HIT; 0.26's store-threshold counts aside, which decide nothing
here), so reading the policy right after the scan, still inside vLLM's call, gives
the same results the scan got.

The scan reads every lookup of a round only when nothing else looks keys up:
one KV group, full attention (no sliding-window scan), no secondary tier (a tiering
lookup may start a promotion: its results are not the policy's), no 0.33 partial-tail
lookup (models with a recurrent group), and vLLM's own CPU manager (its ``lookup``
not overridden), on a release whose scan was read (0.26 .. 0.33). Anywhere else the
manager proxy records each key (manager_proxy.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.v1.kv_offload.base import LookupResult

from kvscope.connector.compat import versions
from kvscope.connector.compat.tiers import secondary_tiers

SCAN_METHOD = "_maximal_prefix_lookup"


def _cpu_manager_lookup() -> Any:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    return CPUOffloadingManager.lookup


def scan_reader(connector_scheduler: Any, manager: Any) -> Callable[[bytes], Any] | None:
    """When a round's lookups can be read from the prefix scan (see the module's doc): a
    function of a key, what the CPU manager's ``lookup`` answers for it now, read from its
    cache policy without changing anything; else None. Only on the releases whose scan
    was read and tested (``versions.SUPPORTED``): another keeps the per-key tap, whatever
    its scan now answers."""
    low, high = (versions.release(v) for v in versions.SUPPORTED)
    if not low <= versions.release(versions.VLLM_VERSION) <= high:
        return None
    if not callable(getattr(connector_scheduler, SCAN_METHOD, None)):
        return None
    config = getattr(connector_scheduler, "config", None)
    groups = getattr(config, "kv_group_configs", None) or ()
    if len(groups) != 1:
        return None
    group = groups[0]
    if getattr(group, "sliding_window_size_in_chunks", None) is not None:
        return None
    if not (getattr(group, "tokens_per_chunk", 0) or 0) > 0:
        return None
    if getattr(config, "supports_partial_tail", False):
        return None
    if secondary_tiers(manager):
        return None
    try:
        stock = _cpu_manager_lookup()
    except ImportError:
        return None
    if getattr(type(manager), "lookup", None) is not stock:
        return None
    policy = getattr(manager, "_policy", None)
    get = getattr(policy, "get", None)
    if not callable(get):
        return None
    hit, pending, miss = LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.MISS

    def result_of(key: bytes) -> Any:  # as CPUOffloadingManager.lookup answers
        row = get(key)
        if row is None:
            return miss
        return hit if getattr(row, "is_ready", True) else pending

    return result_of
