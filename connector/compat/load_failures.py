"""How a refused load reaches vLLM's ``kv_load_failure_policy`` (recompute | fail).

* vLLM 0.26 and 0.33, one KV-cache group: block level. The worker reports the
  refused load's GPU blocks through ``get_block_ids_with_load_errors``; the
  scheduler maps them back to requests.
* Several groups, vLLM 0.26: block ids are only unique within a group and
  ``Scheduler._update_requests_with_invalid_blocks`` unpacks exactly one group:
  a report would raise inside the engine step. No safe path: kvscope degrades
  ``refuse`` to ``observe`` (see ``connector.settings.effective_policy``).
* Several groups, vLLM 0.33: ``Scheduler._handle_invalid_blocks`` raises
  RuntimeError by design and points to the request-level path:
  ``KVConnectorTransferResults.failed_recving`` from ``get_transfer_results()``
  (``Scheduler._handle_failed_recving``). It applies to requests still
  ``WAITING_FOR_REMOTE_KVS``, i.e. asynchronous loads; OffloadingConnector 0.33
  loads synchronously only within ``sync_load_budget_bytes`` (default 0: never).
  With a sync-load budget set there is again no safe path: ``observe``.
* vLLM 0.34, any number of groups: job level. Its offloading worker accepts failed
  transfers: a ``TransferResult`` with ``success=False`` marks the job failed on every
  rank's metadata, its request comes back through ``failed_recving`` (the policy
  applies) and the scheduler never loads that request from the offloaded cache again.
  It raises for a failed synchronous load (its request already ran), so with a
  sync-load budget set: ``observe``, as in 0.33. The worker sees device addresses,
  not GPU block ids (``device_pointers``), so the block-level report is out of reach.
"""

from __future__ import annotations

from typing import Any

BLOCKS = "blocks"  # get_block_ids_with_load_errors (one KV group)
REQUESTS = "requests"  # get_transfer_results().failed_recving (0.33, async loads)
JOBS = "jobs"  # TransferResult(success=False) (0.34, async loads)


def job_level_supported() -> bool:
    """vLLM 0.34's connector worker collects failed transfers (``take_failed_recving``)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
        OffloadingConnectorWorker,
    )

    return hasattr(OffloadingConnectorWorker, "take_failed_recving")


def request_level_supported() -> bool:
    """vLLM 0.33 has ``KVConnectorTransferResults.failed_recving``; 0.26 has not."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorTransferResults,
        )
    except ImportError:
        return False
    return "failed_recving" in getattr(KVConnectorTransferResults, "__dataclass_fields__", {})


def refusal_path(kv_cache_config: Any, extra_config: dict | None = None) -> str | None:
    """BLOCKS, REQUESTS, JOBS, or None when vLLM cannot recompute a refused load safely."""
    groups = len(getattr(kv_cache_config, "kv_cache_groups", ()) or ())
    sync_budget = int((extra_config or {}).get("sync_load_budget_bytes", 0) or 0)
    if job_level_supported():
        return JOBS if sync_budget == 0 else None
    if groups <= 1:
        return BLOCKS
    if request_level_supported() and sync_budget == 0:
        return REQUESTS
    return None


def with_failed_requests(results: Any, failed_req_ids: set[str]) -> Any:
    """Add failed receives to a 0.33 KVConnectorTransferResults.

    vLLM requires a failed receive to appear in ``finished_recving`` too, so the
    scheduler releases the request from its wait.
    """
    if failed_req_ids:
        results.failed_recving |= failed_req_ids
        results.finished_recving |= failed_req_ids
    return results


def failed_requests(connector_output: Any) -> set[str]:
    """Request ids a (0.33) KVConnectorOutput reports as failed receives."""
    return set(getattr(connector_output, "failed_recving", None) or ())


def load_job_request(job: Any) -> str | None:
    """The request a connector load job (offloading.common.TransferJob) belongs to."""
    return getattr(job, "req_id", None)
