"""vLLM 0.26: a store prepared for a request whose tiering state is gone raises KeyError.

vLLM 0.26.0's ``OffloadingConnectorScheduler.request_finished`` tells the manager at once
(``TieringOffloadingManager.on_request_finished``, which deletes the request's ``_req_state``
entry when no GPU->CPU store of it is pending) and leaves the request's last store to
``_build_store_jobs`` on the next step; ``TieringOffloadingManager.prepare_store`` then reads
``self._req_state[req_id]`` (0.26.0 ``v1/kv_offload/tiering/manager.py`` lines 542 and 546)
and the ``KeyError`` leaves the scheduler's step: EngineCore dies, the stock connector's too.
Two ways there: an earlier store of the request found no free primary row (its keys are
retried after it finished, when a row is free), or, with ``offload_prompt_only`` false, its
last token filled a chunk. Fixed in vLLM 0.27.0 (vLLM #49671, issue #49635): the finished
requests' stores are built before ``on_request_finished`` (checked in the 0.27.0 and 0.33.0
wheels). vLLM's CPU manager alone keeps no such state: not affected.
"""

from __future__ import annotations

from typing import Any

from kvscope.connector.compat import renames
from kvscope.connector.compat.versions import VLLM_VERSION, release

FIXED_IN = "0.27.0"


def has_bug(version: str = VLLM_VERSION) -> bool:
    """This release raises on a store after finish (0.26.x; kvscope supports none older)."""
    return release(version) < release(FIXED_IN)


def request_states(manager: Any, version: str = VLLM_VERSION) -> dict | None:
    """The tiering manager's per-request states, whose missing entry makes its
    ``prepare_store`` raise, on a release with the bug; None elsewhere (a fixed release,
    vLLM's CPU manager alone): there is nothing to contain."""
    if not has_bug(version):
        return None
    states = getattr(manager, "_req_state", None)
    return states if isinstance(states, dict) else None


def raises(manager: Any, keys: Any) -> bool:
    """Whether the tiering manager's ``prepare_store(keys, ...)`` reaches the request's
    state, i.e. raises for a request whose state is gone: its primary tier does not refuse
    the store. 0.26.0's ``CPUOffloadingManager.prepare_store`` (read, not called: it
    allocates) refuses, returning None before the tiering manager reads the state, only
    when the keys it would write (not stored yet; with a ``store_threshold``, only keys
    offered that often) outnumber its free rows plus the idle rows its cache policy may
    evict, the keys of the store itself kept. The tiering manager's ``prepare_store`` first
    takes its tiers' finished jobs in (``_maybe_process_finished_jobs``, once per step: rows
    a finished copy to disk pinned become idle); so does this, so the rows read are those
    vLLM's primary tier would see. Once per such store, never per step."""
    poll = getattr(manager, "_maybe_process_finished_jobs", None)
    if callable(poll):
        poll()
    primary = manager.primary_tier
    policy = getattr(primary, "_policy", None)
    if policy is None:
        return True  # a primary tier kvscope does not know: assume vLLM's raise
    counts = getattr(primary, "counts", None)
    if counts is not None:
        threshold = getattr(primary, "store_threshold", 1)
        keys = [k for k in keys if counts.get(k, 0) >= threshold]
    new = 0
    kept_idle = 0  # the store's own keys are never evicted for it
    for k in keys:
        block = policy.get(k)
        if block is None:
            new += 1
        elif getattr(block, "ref_cnt", -1) == 0:
            kept_idle += 1
    if new == 0:
        return True  # nothing to write: vLLM's answer is a result, not None
    total, allocated, _ = renames.primary_counters(primary)
    free = len(getattr(primary, "_free_list", ())) + total - allocated
    idle = renames.primary_evictable(primary) or 0
    return new - free <= idle - kept_idle


def nothing_to_store(manager: Any, req_context: Any) -> Any:
    """vLLM's own answer for a store with nothing to write (the primary tier asked for no
    keys: no row taken, none evicted); the connector then advances the request and lets it
    go, as when every key is already stored."""
    return manager.primary_tier.prepare_store([], req_context)
