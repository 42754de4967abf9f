"""vLLM 0.34 hands a worker's transfers their GPU side as device addresses.

0.26 and 0.33: ``OffloadingWorker.submit_store(job, src, dst)`` and
``submit_load(job, src, dst)`` take the GPU side as a ``GPULoadStoreSpec``
(``block_ids``, ``group_sizes``). 0.34: as ``DevicePointers``, which vLLM's
connector worker resolves from that spec before submitting (``ptrs``/``sizes`` per
block and layer, ``group_block_counts`` blocks per KV group; a store's chunk keeps
null blocks as placeholders). The block ids stay in the connector metadata's
``GPULoadStoreSpec`` (``bound_load_jobs``).
"""

from __future__ import annotations

from typing import Any


def gpu_block_count(spec: Any) -> int:
    """GPU blocks a transfer moves: ``len(block_ids)`` (0.26, 0.33) or the sum of
    ``group_block_counts`` (0.34 ``DevicePointers``)."""
    ids = getattr(spec, "block_ids", None)
    if ids is not None:
        return len(ids)
    return int(sum(getattr(spec, "group_block_counts", ()) or ()))

